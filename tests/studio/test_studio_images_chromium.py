"""The trajectory viewer shows each segment's images in its turn (issue 31), in real headless
Chromium against a real `rlfactory ui` process."""

from __future__ import annotations

import pytest

from test_studio_images import write_image_run

pytestmark = [pytest.mark.chromium, pytest.mark.slow]


def test_the_viewer_shows_images_in_their_turns(page, studio, runs_root):
    _, pics = write_image_run(runs_root, "pics_view")
    page.goto(f"{studio.url}/#/run/pics_view?tab=traj&step=1")
    page.wait_for_selector("#groups .member")
    page.click("#groups .member[data-index='0']")
    page.wait_for_selector("#segments .seg.observation .seg-image img")
    per_segment = page.eval_on_selector_all("#segments .seg", """segs => segs.map(s => ({
        role: s.dataset.role,
        images: [...s.querySelectorAll('.seg-image img')].map(i => ({src: i.getAttribute('src'), alt: i.alt})),
    }))""")
    assert [s["role"] for s in per_segment] == ["prompt", "model", "observation", "model"]
    assert [len(s["images"]) for s in per_segment] == [1, 0, 2, 0]
    shown = [im["src"] for s in per_segment for im in s["images"]]
    assert [p.sha256 in src for p, src in zip(pics, shown)] == [True, True, True]
    assert "32×32 px" in per_segment[2]["images"][0]["alt"]
    # the browser decoded the served bytes: each picture at its own size
    page.wait_for_function("[...document.querySelectorAll('#segments .seg-image img')].every(i => i.complete && i.naturalWidth > 0)")
    sizes = page.eval_on_selector_all("#segments .seg-image img", "imgs => imgs.map(i => [i.naturalWidth, i.naturalHeight])")
    assert sizes == [[48, 48], [32, 32], [16, 16]]
