"""Images on trajectories: JSON lines stay lossless, each image stored once beside them by content
hash; a missing or altered image file is one clear error."""

from __future__ import annotations

import json

import pytest
from PIL import Image as PILImage

from rlfactory.images import ImageError, image_from_pil
from rlfactory.trajectory import Segment, Trajectory, image_dir, read_jsonl, write_jsonl


def picture(color, size=(12, 8)):
    return image_from_pil(PILImage.new("RGB", size, color))


def image_trajectory(k: int = 0) -> Trajectory:
    a, b = picture((255, 0, 0)), picture((0, k, 255), (20, 20))
    return Trajectory(id=f"g-{k}", group="g", segments=[
        Segment("prompt", [1, 7, 7, 7, 2], "q", images=[a]),
        Segment("model", [5, 6], "call", logprobs=[-0.5, -0.25], policy_version=3),
        Segment("observation", [1, 7, 7, 9, 9, 2], "obs", images=[a, b]),
        Segment("model", [8], "done", logprobs=[-0.125], policy_version=3),
    ], turns=2)


def test_trajectories_with_images_round_trip_through_json_lines(tmp_path):
    path = tmp_path / "run" / "step_000001.jsonl"
    path.parent.mkdir()
    trajs = [image_trajectory(0), image_trajectory(1)]
    write_jsonl(path, trajs)
    stored = sorted(p.name for p in image_dir(path).iterdir())
    assert stored == sorted({im.file_name() for t in trajs for im in t.images()})  # each image once: 3 of 6
    assert len(stored) == 3
    line = json.loads(path.read_text().splitlines()[0])
    assert line["segments"][0]["images"] == [trajs[0].segments[0].images[0].ref()]
    assert "images" not in line["segments"][1] and len(path.read_text()) < 4000  # references, no pixels
    back = read_jsonl(path)
    assert back == trajs
    assert back[0].loss_mask == [0] * 5 + [1, 1] + [0] * 6 + [1]


def test_a_line_without_images_is_unchanged(tmp_path):
    t = Trajectory(id="g-0", group="g", segments=[Segment("prompt", [1]), Segment("model", [2], logprobs=[-1.0])])
    assert all("images" not in s for s in t.to_dict()["segments"])
    write_jsonl(tmp_path / "t.jsonl", [t])
    assert not image_dir(tmp_path / "t.jsonl").exists() and read_jsonl(tmp_path / "t.jsonl") == [t]


def test_a_missing_or_altered_image_file_is_named(tmp_path):
    path = tmp_path / "t.jsonl"
    t = image_trajectory()
    write_jsonl(path, [t])
    victim = image_dir(path) / t.segments[2].images[1].file_name()
    victim.write_bytes(b"something else")
    with pytest.raises(ImageError, match="does not hold the image .*hash differs"):
        read_jsonl(path)
    victim.unlink()
    with pytest.raises(ImageError, match=f"missing: cannot read {victim}"):
        read_jsonl(path)
