"""The studio serves a run's trajectory images (issue 31) through /api/run/image: only
`<sha256>.png|jpg` names, only from the run's trajectories/images folder; the trajectory view
carries each segment's image references. Against a real `rlfactory ui` process; the run folder is
written by the real Trajectory JSON writer."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rlfactory.images import image_from_array
from rlfactory.trajectory import Segment, ToolCallRecord, Trajectory, write_jsonl


def picture(seed: int, size: int = 32):
    rng = np.random.default_rng(seed)
    return image_from_array(rng.integers(0, 255, (size, size, 3), dtype=np.uint8))


def write_image_run(root: Path, name: str = "pics") -> tuple[Path, list]:
    """A run whose one step holds a trajectory with an image in its prompt and two in an observation."""
    run = root / name
    (run / "trajectories").mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text("model: {path: tiny-vl:1m}\nenv: {name: visual}\ntrainer: {steps: 1}\n")
    pics = [picture(1, 48), picture(2, 32), picture(3, 16)]
    segs = [Segment("prompt", [1, 2, 3], "Q <image>", images=[pics[0]]),
            Segment("model", [4, 5], "zoom", [-0.5, -0.25], 0),
            Segment("observation", [6, 7, 8], "<image><image>", images=pics[1:]),
            Segment("model", [9], "answer", [-0.1], 0)]
    t = Trajectory("g-0", "g", segs, [ToolCallRecord("zoom", {"x": 1}, "ok", 0.1, turn=1)], turns=2, reward=1.0)
    write_jsonl(run / "trajectories" / "step_000001.jsonl", [t])
    return run, pics


def test_the_image_route_serves_only_the_runs_hashed_images(studio, runs_root):
    run, pics = write_image_run(runs_root, "pics_route")
    view = studio.api("/api/run/trajectory?run=pics_route&step=1&index=0").json()
    assert [[im["sha256"] for im in s["images"]] for s in view["segments"]] == [
        [pics[0].sha256], [], [pics[1].sha256, pics[2].sha256], []]
    assert view["segments"][2]["images"][0] == pics[1].ref()

    r = studio.api(f"/api/run/image?run=pics_route&name={pics[1].sha256}.png")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png" and r.content == pics[1].data
    assert r.headers["x-content-type-options"] == "nosniff"

    # a name that is not a content hash, or reaches outside the folder, is refused with one line
    for bad in ("../config.yaml", f"{pics[1].sha256}.html", pics[1].sha256, f"{pics[1].sha256.upper()}.png",
                f"../../pics_route/trajectories/images/{pics[1].sha256}.png", "%2e%2e%2fconfig.yaml", ""):
        r = studio.api("/api/run/image", params={"run": "pics_route", "name": bad})
        assert r.status_code == 400, (bad, r.status_code, r.text)
        assert "sha256" in r.json()["error"]
    missing = "0" * 64
    r = studio.api(f"/api/run/image?run=pics_route&name={missing}.png")
    assert r.status_code == 404 and "no image" in r.json()["error"]
    # a run outside the runs folder
    r = studio.api(f"/api/run/image?run=../elsewhere&name={pics[1].sha256}.png")
    assert r.status_code == 400

    # a hashed name that is a symlink out of the run is not followed out
    secret = runs_root.parent / "secret.png"
    secret.write_bytes(b"not for the browser")
    link = run / "trajectories" / "images" / f"{'a' * 64}.png"
    os.symlink(secret, link)
    r = studio.api(f"/api/run/image?run=pics_route&name={'a' * 64}.png")
    assert r.status_code == 400 and b"not for the browser" not in r.content


def test_the_image_route_needs_the_token(studio, runs_root):
    import httpx

    _, pics = write_image_run(runs_root, "pics_auth")
    r = httpx.get(f"{studio.url}/api/run/image?run=pics_auth&name={pics[0].sha256}.png", timeout=30)
    assert r.status_code == 401 and r.content != pics[0].data
