"""`tiny:1m-copy`: rlfactory's tiny model pretrained on generic copy text (rlfactory/tiny/pretrain.py),
made on first use and cached like tiny:1m."""

from __future__ import annotations

import json
import random
import re
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlfactory.tiny import copy_corpus, parse_tiny_spec, resolve_model
from rlfactory.tiny.cache import ensure_tiny, tiny_dir
from rlfactory.tiny.model import MARKER
from rlfactory.tiny.pretrain import CopyRecipe, batches, copied_token_accuracy, make_copy_model

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = CopyRecipe(steps=3, batch_size=2, seq_len=64, warmup=1)


def test_copy_specs_parse_and_a_misspelt_one_names_the_choices():
    assert parse_tiny_spec("tiny:1m-copy") == ("1m-copy", 0)
    assert parse_tiny_spec("tiny:10m-copy:2") == ("10m-copy", 2)
    with pytest.raises(ValueError, match=r"tiny:1m-cpy.*'1m-copy'"):
        parse_tiny_spec("tiny:1m-cpy")


def test_the_corpus_copies_values_from_the_question_and_the_result_into_the_answer():
    rng = random.Random(0)
    for _ in range(200):
        msgs, tools = copy_corpus.chat_messages(rng)
        question, call, result, answer = (msgs[-4]["content"], msgs[-3]["tool_calls"][0]["function"],
                                          msgs[-2]["content"], msgs[-1]["content"])
        assert call["name"] in {t["function"]["name"] for t in tools}
        assert list(call["arguments"]) == next(t for t in tools if t["function"]["name"] == call["name"])["function"]["parameters"]["required"]
        for v in call["arguments"].values():
            assert str(v) in question, (question, call)
        assert answer.startswith("<answer>") and answer[8:-9] in result
    a, b = random.Random(5), random.Random(5)
    assert [copy_corpus.compact_doc(a) for _ in range(5)] == [copy_corpus.compact_doc(b) for _ in range(5)]


def test_built_once_into_the_cache_as_a_standard_folder_then_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFACTORY_CACHE", str(tmp_path))
    path = ensure_tiny("1m-copy", 0, copy_recipe=SMALL)
    assert path == tiny_dir("1m-copy", 0) and (tmp_path / "tiny-1m-seed0").is_dir()  # the base came first
    marker = json.loads((path / MARKER).read_text())
    assert marker["recipe"]["steps"] == 3 and marker["tokens"] == 3 * 2 * 64
    weights = (path / "model.safetensors").stat().st_mtime_ns
    start = time.monotonic()
    assert resolve_model("tiny:1m-copy") == str(path)  # cached: not built again
    assert time.monotonic() - start < 2 and (path / "model.safetensors").stat().st_mtime_ns == weights
    # a standard Hugging Face folder, with tiny:1m's tokenizer and architecture and other weights
    base = tmp_path / "tiny-1m-seed0"
    assert (path / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    model, plain = AutoModelForCausalLM.from_pretrained(path), AutoModelForCausalLM.from_pretrained(base)
    assert model.config.to_dict() | {"_name_or_path": ""} == plain.config.to_dict() | {"_name_or_path": ""}
    assert not torch.equal(model.model.embed_tokens.weight, plain.model.embed_tokens.weight)
    assert AutoTokenizer.from_pretrained(path).eos_token == "<|im_end|>"


def test_same_seed_same_weights_other_seed_other_weights(tmp_path):
    from rlfactory.tiny.model import make_tiny_model

    base = make_tiny_model(tmp_path / "base", "1m", 0)
    one = make_copy_model(tmp_path / "a", base, "1m", 0, SMALL, log=lambda m: None)
    two = make_copy_model(tmp_path / "b", base, "1m", 0, SMALL, log=lambda m: None)
    other = make_copy_model(tmp_path / "c", base, "1m", 1, SMALL, log=lambda m: None)
    assert (one / "model.safetensors").read_bytes() == (two / "model.safetensors").read_bytes()
    assert (one / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()


def test_the_copy_text_answers_with_the_tools_result_in_the_format_rlfactory_writes():
    """The episode's last step (the tool's result copied into <answer>) is in the pretraining stream
    often, with results of every length up to 8 digits, and written as the qwen3 family writes a
    final answer (no empty think block, which the chat template alone puts before a last turn)."""
    tok = AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))
    stream = ""
    for _, rows in zip(range(8), batches(tok, 0, CopyRecipe())):
        stream += "".join(tok.decode(r) for r in rows)
    steps = re.findall(r"<tool_response>\n(.*?)\n</tool_response><\|im_end\|>\n<\|im_start\|>assistant\n"
                       r"<answer>(.*?)</answer><\|im_end\|>", stream, re.S)
    assert len(steps) >= 60, len(steps)  # 8 rows of 4 x 512 tokens
    assert all(answer in result for result, answer in steps)
    lengths = {len(a) for _, a in steps if a.isdigit()}
    assert set(range(2, 9)) <= lengths, lengths
    # the answer is not the first number of the response in many of them (it must be found, not grabbed)
    first = [re.search(r"\d+(?:\.\d+)?", r) for r, _ in steps]
    assert sum(m is not None and m.group() != a for m, (_, a) in zip(first, steps)) >= len(steps) // 4
    assert "<think>" not in stream


def test_a_chat_document_renders_as_an_rlfactory_demonstration_of_it():
    from rlfactory.chat.registry import make_tool_manager
    from rlfactory.tools.base import ToolSpec
    from rlfactory.train.sft import demo_to_trajectory

    tok = AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))
    tm = make_tool_manager(tok, "qwen3")
    rng = random.Random(3)
    for _ in range(5):
        msgs, tools = copy_corpus.chat_messages(rng)
        specs = [ToolSpec(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
                 for t in tools]
        demo = "".join(tok.decode(s.token_ids) for s in demo_to_trajectory(msgs, tm, specs).segments)
        text = copy_corpus.chat_text(tok, msgs, tools)
        # the same from the question on (the tools block lists the same schemas, in the template's key order)
        at = text.index("<|im_start|>user\n")
        assert text[at:].rstrip("\n") == demo[demo.index("<|im_start|>user\n"):], (text[at:], demo)


@pytest.mark.slow
def test_the_pretraining_moves_the_model_towards_copying_values_into_a_call_and_the_result_into_the_answer():
    """The real recipe (built on first use, minutes on a CPU core; then cached), on held-out generic
    conversations: the tokens of the call's argument values and of the answer's value (copied from
    the tool's response), teacher-forced. Measured with copy recipe 2: call 0.131, answer 0.198
    after the pretraining; 0.038 and 0.037 before (recipe 1's model: 0.100 and 0.056). That is a
    start, not a copier (greedy calls on generic questions still get values wrong); what it buys
    is that a few hundred demonstrations of a task then teach copying, which they do not from
    tiny:1m (README "Your own task", benchmarks/results/own_task.txt)."""
    copy = resolve_model("tiny:1m-copy")
    base = resolve_model("tiny:1m")
    tok = AutoTokenizer.from_pretrained(copy)
    trained, untrained = (AutoModelForCausalLM.from_pretrained(p).eval() for p in (copy, base))
    call = copied_token_accuracy(trained, tok, seed=0), copied_token_accuracy(untrained, tok, seed=0)
    answer = (copied_token_accuracy(trained, tok, seed=0, n=32, part="answer"),
              copied_token_accuracy(untrained, tok, seed=0, n=32, part="answer"))
    assert call[1] < 0.05 and call[0] >= 0.1, call
    assert answer[1] < 0.05 and answer[0] >= 0.12, answer
