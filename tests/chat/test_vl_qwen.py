"""The `qwen2_5_vl` ToolManager on rlfactory's tiny Qwen2.5-VL: image pads as many as the image
processor's grid gives (checked by the model's own forward, which refuses a wrong count), the token
contract over image turns, observation truncation that drops whole images with a note, and hostile
images and text."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from PIL import Image as PILImage
from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from rlfactory.chat.base import ToolCalls
from rlfactory.chat.contract import SAMPLE_TOOLS, TokenContractError, check_token_contract
from rlfactory.chat.qwen_vl import QwenVLToolManager
from rlfactory.chat.template import ModelTurn
from rlfactory.chat.vision import DROPPED_NOTE, result_content
from rlfactory.images import ImageError, image_from_pil
from rlfactory.tiny.vl import make_tiny_vl_model
from rlfactory.tools.base import ToolCall, ToolResult

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return make_tiny_vl_model(tmp_path_factory.mktemp("tinyvl") / "m", "1m", seed=0)


@pytest.fixture(scope="module")
def tm(vl_dir):
    return QwenVLToolManager(AutoTokenizer.from_pretrained(vl_dir), enable_thinking=False)


def picture(w: int, h: int, color=(200, 30, 30)):
    return image_from_pil(PILImage.new("RGB", (w, h), color))


def test_a_prompt_image_becomes_as_many_pads_as_the_processors_grid(tm, vl_dir):
    im = picture(40, 24)
    messages = [{"role": "user", "content": [{"type": "text", "text": "What colour is it?"},
                                             {"type": "image", "image": im.data}]}]
    r = tm.render_prompt_images(messages, SAMPLE_TOOLS)
    grid = AutoImageProcessor.from_pretrained(vl_dir)(images=[im.to_pil()], return_tensors="pt")["image_grid_thw"][0]
    n = int(grid.prod()) // 4  # merge_size 2
    assert r.images == [im] and r.grids == [tuple(grid.tolist())] and n > 1
    pad, start, end = (tm.template.token_id(t) for t in ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>"))
    i = r.ids.index(start)
    assert r.ids[i + 1: i + 1 + n] == [pad] * n and r.ids[i + 1 + n] == end and r.ids.count(pad) == n
    assert tm.render_prompt(messages, SAMPLE_TOOLS) == r.ids


def test_the_token_contract_covers_image_turns(tm):
    check_token_contract(tm)  # the sample has an image in the question and two in a tool result


def test_the_contract_check_catches_images_rendered_out_of_place(tm, monkeypatch):
    def images_first(results):  # images before the text: not what the template renders
        context = [{"role": "user", "content": "?"}, tm.assistant_message(ModelTurn([ToolCall("f", {})], reasoning="."))]
        msgs = [{"role": "tool", "content": list(reversed(c)) if isinstance(c := result_content(r), list) else c}
                for r in results]
        return tm.template.delta_after_turn(context, msgs, "<|im_end|>")

    monkeypatch.setattr(tm, "observation_text", images_first)
    with pytest.raises(TokenContractError, match="observation segment"):
        check_token_contract(tm)


def test_the_models_forward_takes_the_ids_and_pixels_of_a_multi_turn_image_conversation(tm, vl_dir):
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(vl_dir).eval()
    prompt = tm.render_prompt_images(
        [{"role": "user", "content": [{"type": "image", "image": picture(32, 32).data}, {"type": "text", "text": "Zoom?"}]}],
        SAMPLE_TOOLS)
    turn = tm.model_turn_ids(ModelTurn([ToolCall("zoom", {"x": 1})]))
    obs = tm.render_observation_images([ToolResult("two crops", images=[picture(64, 16), picture(8, 8, (0, 0, 9))])])
    ids = prompt.ids + turn + obs.ids
    images = prompt.images + obs.images
    inputs = tm.model_inputs(ids, images)
    assert inputs["image_grid_thw"].tolist() == [list(g) for g in prompt.grids + obs.grids]
    assert int(inputs["mm_token_type_ids"].sum()) == sum(tm.image_tokens(im) for im in images)
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape[:2] == (1, len(ids)) and torch.isfinite(out.logits).all()
    # One pad too many: the vision encoder's embeddings no longer match the pads, and the model says so.
    wrong = ids[:]
    wrong.insert(wrong.index(tm.pad_id), tm.pad_id)
    with pytest.raises(ValueError, match="[Ii]mage features and image tokens do not match"):
        model(**tm.model_inputs(wrong, images))


def test_truncation_drops_whole_images_with_a_note_never_half_of_one(tm):
    a, b = picture(64, 64), picture(64, 64, (0, 90, 0))
    per = tm.image_tokens(a)
    results = [ToolResult("first", images=[a]), ToolResult("second", images=[b])]
    full = len(tm.render_observation(results))
    bare = len(tm.render_observation([ToolResult("", images=[a]), ToolResult("", images=[b])]))
    fitted, keep = tm.fit_images(results, bare - per // 2)  # room for one image, not two
    assert [len(r.images) for r in fitted] == [1, 0] and keep == [0, len(DROPPED_NOTE) + 1]
    assert fitted[1].text == DROPPED_NOTE + "\nsecond" and fitted[0].text == "first"
    ids = tm.render_observation(fitted)
    assert ids.count(tm.pad_id) == per
    assert tm.fit_images(results, full) == (results, [0, 0])  # fits: nothing dropped
    none_fit, keep = tm.fit_images(results, 5)
    assert all(not r.images and r.text.startswith(DROPPED_NOTE) for r in none_fit)
    assert [r.text[:k] for r, k in zip(none_fit, keep)] == [DROPPED_NOTE + "\n"] * 2


def test_hostile_images_and_text(tm):
    # An image the processor refuses (aspect ratio past 200:1) is replaced by a line saying why.
    thin = picture(1000, 2)
    obs = tm.render_observation_images([ToolResult("look", images=[thin, picture(16, 16)])])
    assert len(obs.images) == 1 and obs.ids.count(tm.pad_id) == tm.image_tokens(obs.images[0])
    assert "[image not shown: the image processor refuses a 1000x2 image" in tm.tokenizer.decode(obs.ids)
    # Text that holds the pad token itself cannot pass as an image.
    with pytest.raises(ValueError, match="image placeholder"):
        tm.render_prompt([{"role": "user", "content": "<|image_pad|> hi"}], [])
    with pytest.raises(ImageError, match="not an image Pillow can read"):
        tm.render_prompt([{"role": "user", "content": [{"type": "image", "image": b"nope"}]}], [])


def test_parse_and_stops_are_the_qwen3_familys(tm):
    parsed = tm.parse('<tool_call>\n{"name": "zoom", "arguments": {"x": 2}}\n</tool_call>')
    assert isinstance(parsed, ToolCalls) and parsed.calls[0].name == "zoom"
    assert tm.template.token_id("<|im_end|>") in tm.stop_token_ids()


def test_without_an_image_processor_the_error_names_the_folder(tmp_path, vl_dir):
    tok = AutoTokenizer.from_pretrained(vl_dir)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="preprocessor_config.json"):
        QwenVLToolManager(AutoTokenizer.from_pretrained(tmp_path))


def test_results_are_dataclass_copies_not_mutated(tm):
    r = ToolResult("x", images=[picture(64, 64)])
    before = dataclasses.replace(r)
    tm.fit_images([r], 3)
    assert r == before


def test_the_family_is_guessed_from_the_template_and_named_in_config(vl_dir):
    from rlfactory.chat.registry import guess_family, make_tool_manager

    tok = AutoTokenizer.from_pretrained(vl_dir)
    assert guess_family(tok) == "qwen2_5_vl"
    assert isinstance(make_tool_manager(tok), QwenVLToolManager)
    assert make_tool_manager(tok, "qwen3_vl").family == "qwen3_vl"
    # Qwen2.5-VL's own template renders no tools: the family is still guessed, and uses rlfactory's template.
    tok.chat_template = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is "
                         "string %}{{ message['content'] }}{% else %}{% for c in message['content'] %}{% if c['type'] == "
                         "'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
                         "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                         "<|im_start|>assistant\n{% endif %}")
    assert guess_family(tok) == "qwen2_5_vl"
    tm = make_tool_manager(tok)
    assert "<tools>" in tm.tokenizer.decode(tm.render_prompt([{"role": "user", "content": "hi"}], SAMPLE_TOOLS))
    check_token_contract(tm)
