"""The playground's question may hold an image (issue 31): the real worker process rolls out
`tiny-vl:1m` on a question with a PNG, and the prompt segment holds the image with as many
`<|image_pad|>` tokens as the model's image processor gives it, the view carrying its bytes. What it
cannot show is one line: a bad data URL (the route), an env that builds its own prompts, a
text-only model (the worker)."""

from __future__ import annotations

import base64
import time

import pytest

from conftest import CALC, ROOT
from rlfactory.studio.playground import PlaygroundRun
from rlfactory.studio.routes_tools import question_image
from rlfactory.studio.web import ApiError
from test_studio_images import picture


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def roll_out(timeout: float = 120, **request) -> list[dict]:
    """The events of one real playground rollout (the worker process), up to `done`."""
    req = {"config": None, "model": "tiny-vl:1m", "question": "What colour is the square?", "max_turns": 1,
           "max_new_tokens": 4, "temperature": 1.0, "seed": 0, **request}
    run = PlaygroundRun(req, ROOT)
    try:
        end = time.monotonic() + timeout
        events = run.wait_events(0, 1.0)
        while not events or events[-1]["type"] != "done":
            assert time.monotonic() < end, f"no `done` in {timeout} s: {events[-3:]}"
            events = run.wait_events(0, 1.0)
        return events
    finally:
        run.stop()


def one(events: list[dict], kind: str) -> dict:
    found = [e for e in events if e["type"] == kind]
    assert len(found) == 1, (kind, [e["type"] for e in events], [e.get("message") for e in events])
    return found[0]


def test_the_question_image_is_in_the_prompt_segment_with_its_pads_and_in_the_view():
    from transformers import AutoImageProcessor, AutoTokenizer

    from rlfactory.tiny import resolve_model

    pic = picture(7, 32)
    url = data_url(pic.data)
    events = roll_out(config=str(CALC), image=url)  # a run config whose env is PromptEnv, with a system prompt
    traj = one(events, "trajectory")
    d, view = traj["trajectory"], traj["view"]
    assert d["status"] != "infra_error", d.get("error")
    prompt = d["segments"][0]
    assert prompt["role"] == "prompt" and prompt["images"] == [pic.ref()]
    assert "You can call the calculate tool" in prompt["text"]  # env.options.system still opens the prompt
    assert "What colour is the square?" in prompt["text"]

    folder = resolve_model("tiny-vl:1m")
    pad = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<|image_pad|>")
    processor = AutoImageProcessor.from_pretrained(folder)
    grid = processor(images=[pic.to_pil()], return_tensors="pt")["image_grid_thw"][0].tolist()
    pads = grid[0] * grid[1] * grid[2] // processor.merge_size ** 2
    assert pads >= 4
    assert prompt["token_ids"].count(pad) == pads
    assert sum(1 for s in d["segments"] for i in s["token_ids"] if i == pad) == pads  # no other segment has one

    shown = view["segments"][0]
    assert [r[0] for r in shown["tokens"]].count(pad) == pads
    assert [{k: v for k, v in im.items() if k != "src"} for im in shown["images"]] == [pic.ref()]
    assert shown["images"][0]["src"] == url  # the bytes travel in the view: no run folder serves them
    assert all(not s["images"] for s in view["segments"][1:])
    # the live prompt event carries it too; the row's info keeps the question, not the bytes again
    assert one(events, "prompt")["images"][0]["src"] == url
    assert d["info"]["messages"][0]["content"] == [{"type": "text", "text": "What colour is the square?"},
                                                   {"type": "image"}]
    assert url not in str(d["info"]) and url not in str(view["info"])
    assert events[-1] == {"type": "done"} and not [e for e in events if e["type"] == "error"]


def test_an_env_that_builds_its_own_prompts_refuses_the_image_in_one_line(tmp_path):
    config = tmp_path / "calc_env.yaml"
    config.write_text("model: {path: tiny:1m}\nenv: {name: calculator}\n")
    events = roll_out(config=str(config), model="tiny:1m", image=data_url(picture(1, 16).data))
    error = one(events, "error")["message"]
    assert "\n" not in error and "needs a tool config or the prompt env" in error and "CalculatorEnv" in error
    assert not [e for e in events if e["type"] in ("prompt", "model", "trajectory")]


def test_a_text_only_model_asks_for_a_vision_language_model_in_one_line():
    events = roll_out(model="tiny:1m", image=data_url(picture(2, 16).data))
    error = one(events, "error")["message"]
    assert "\n" not in error and "pick a vision-language model such as tiny-vl:1m" in error and "tiny:1m" in error
    assert not [e for e in events if e["type"] in ("prompt", "model", "trajectory")]


def test_the_image_must_be_a_png_or_jpeg_data_url_within_the_upload_cap():
    png = picture(3, 16).data
    assert question_image(None, 1 << 20) is None and question_image("", 1 << 20) is None
    assert question_image(data_url(png), 1 << 20) == data_url(png)
    with pytest.raises(ApiError) as e:
        question_image(data_url(png), len(png) - 1)
    assert e.value.status == 413 and e.value.message.startswith("image: ") and "--max-upload-mb" in e.value.message
    assert question_image(data_url(png), len(png)) == data_url(png)


@pytest.mark.parametrize("bad, why", [
    ("https://example.com/a.png", "data:image/png or data:image/jpeg"),
    ("data:image/gif;base64,R0lGODlhAQABAAAAACw=", "data:image/png or data:image/jpeg"),
    ("data:image/png,plain", "data:image/png or data:image/jpeg"),
    ("data:image/png;base64,@@not base64@@", "not valid base64"),
    (data_url(b"not a picture at all"), "not an image Pillow can read"),
    (data_url(picture(4, 16).data[:60]), "cannot decode"),
    (["data:image/png;base64,"], "data:image/png or data:image/jpeg"),
])
def test_the_route_refuses_a_bad_image_in_one_line_naming_the_field(studio, bad, why):
    r = studio.api("/api/playground/start", method="POST",
                   json={"model": "tiny-vl:1m", "question": "what is it?", "image": bad})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error.startswith("image: ") and why in error and "\n" not in error, error


def test_the_models_list_offers_the_tiny_vision_language_model(studio):
    models = studio.api("/api/models").json()["models"]
    vl = [m for m in models if m["path"] == "tiny-vl:1m"]
    assert len(vl) == 1 and "vision-language" in vl[0]["label"]
