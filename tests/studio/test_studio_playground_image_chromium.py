"""The playground takes an image with the question (issue 31): pick `tiny-vl:1m`, attach a PNG
through the file input, run, and the final trajectory shows the picture in its prompt turn. Real
`rlfactory ui` process, real worker, headless Chromium."""

from __future__ import annotations

import pytest

from test_studio_images import picture

pytestmark = [pytest.mark.chromium, pytest.mark.slow]


def test_the_playground_shows_the_questions_image_in_the_prompt_turn(page, studio, tmp_path):
    pic = picture(5, 32)
    path = tmp_path / "square.png"
    path.write_bytes(pic.data)
    page.goto(f"{studio.url}/#/playground")
    page.select_option("#pg-model", "tiny-vl:1m")
    page.select_option("#pg-config", label="examples/rollout_calculator.yaml")
    page.fill("#pg-question", "What colour is the square?")
    page.fill("#pg-turns", "1")
    page.fill("#pg-max-new", "4")
    # attach, clear, attach again: the preview follows the input
    page.set_input_files("#pg-image", str(path))
    page.wait_for_selector("#pg-image-preview:not([hidden])")
    page.click("#pg-image-clear")
    page.wait_for_selector("#pg-image-preview", state="hidden")
    assert page.eval_on_selector("#pg-image", "i => i.files.length") == 0
    page.set_input_files("#pg-image", str(path))
    page.wait_for_selector("#pg-image-preview:not([hidden])")

    page.click("#pg-run")
    page.wait_for_selector("#pg-done, #pg-state .error-box", timeout=180000)
    assert page.query_selector("#pg-state .error-box") is None, page.inner_text("#pg-state")
    # the final trajectory's view (the live one it replaced showed the prompt event's image too)
    assert page.get_attribute("#pg-live .traj", "data-id") == "playground-0"
    roles = [s.get_attribute("data-role") for s in page.query_selector_all("#pg-live .seg")]
    assert roles == ["prompt", "model"]
    page.wait_for_function("[...document.querySelectorAll('#pg-live .seg-image img')].every(i => i.complete && i.naturalWidth > 0)")
    shown = page.eval_on_selector_all("#pg-live .seg", """segs => segs.map(s => [...s.querySelectorAll('.seg-image img')]
        .map(i => ({src: i.getAttribute('src'), size: [i.naturalWidth, i.naturalHeight], alt: i.alt})))""")
    assert [len(s) for s in shown] == [1, 0]
    (im,) = shown[0]
    assert im["src"].startswith("data:image/png;base64,") and im["size"] == [32, 32]
    assert pic.sha256[:12] in im["alt"]
