"""ChatTemplate.delta_after_turn fills tool results into a once-rendered skeleton (template.py):
the texts equal full renders, and templates that change contents are rendered in full."""

from __future__ import annotations

import logging
import random

from rlfactory.chat import Qwen3ToolManager
from rlfactory.chat.llama3 import Llama3ToolManager
from rlfactory.chat.template import FILL_CHECKS, ChatTemplate
from rlfactory.tools.base import ToolResult

HOSTILE = ["", " ", "  padded  \n", 'say "hi" & <b>x</b> \\n {{ x }} {% if %}', "<tool_response>\n</tool_response>",
           "<|im_end|>\n<|im_start|>user\n", "line\r\nwindows\ttab", "ünïcode ✓ 😀", "rlfactory-content-probe-0"]


def counting(template: ChatTemplate) -> list:
    renders = []
    render = template.render
    template.render = lambda *a, **k: renders.append(a) or render(*a, **k)
    return renders


def test_qwen3_observations_equal_full_renders_and_stop_rendering_after_the_checks(tiny_tokenizer):
    """Hostile texts, one or two results per turn: every observation equals a fresh manager's (a full
    render each); after FILL_CHECKS compared fills, an observation renders no template at all."""
    qwen = Qwen3ToolManager(tiny_tokenizer)
    renders = counting(qwen.template)
    rng = random.Random(3)
    turns = [[ToolResult(text=rng.choice(HOSTILE) + f" {i}" + rng.choice(HOSTILE)) for _ in range(1 + i % 2)]
             for i in range(2 * FILL_CHECKS + 20)]
    texts = [qwen.observation_text(t) for t in turns]
    checked = len(renders)
    assert checked <= 1 + 2 + FILL_CHECKS  # the context, one skeleton per shape (1 and 2 results), the checks
    qwen.observation_text([ToolResult(text="after the checks")])
    ids = [qwen.render_observation([ToolResult(text=h)]) for h in HOSTILE]
    assert len(renders) == checked
    fresh = Qwen3ToolManager(tiny_tokenizer)
    fresh.template._filled_checks = -1  # full renders only
    assert texts == [fresh.observation_text(t) for t in turns]
    assert ids == [fresh.render_observation([ToolResult(text=h)]) for h in HOSTILE]


def test_a_template_that_json_quotes_tool_contents_is_rendered_in_full(llama31_tokenizer):
    """Llama 3.1's template writes a tool result `| tojson` (quoted, escaped): the probe is not in its
    render verbatim, so no skeleton, every observation a full render (the texts a fresh one gives)."""
    llama = Llama3ToolManager(llama31_tokenizer)
    renders = counting(llama.template)
    texts = [llama.observation_text([ToolResult(text=h)]) for h in HOSTILE]
    assert len(renders) >= len(HOSTILE)
    fresh = Llama3ToolManager(llama31_tokenizer)
    fresh.template._filled_checks = -1
    assert texts == [fresh.observation_text([ToolResult(text=h)]) for h in HOSTILE]


BRANCHING = ("{% for m in messages %}<{{ m.role }}>{% if m.role == 'tool' and m.content.startswith('ERR') %}"
             "!{{ m.content[3:] }}{% else %}{{ m.content }}{% endif %}</{{ m.role }}>{% endfor %}"
             "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_a_template_that_branches_on_the_content_is_caught_and_rendered_in_full(tiny_tokenizer, caplog):
    """The probe passes (written verbatim once), but a content the template treats otherwise differs
    from its full render: one warning line, that text and all later ones rendered in full."""
    template = ChatTemplate(tiny_tokenizer, BRANCHING)
    context = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    tool = lambda text: [{"role": "tool", "content": text}]  # noqa: E731
    assert template.delta_after_turn(context, tool("fine"), "</assistant>") == "<tool>fine</tool><assistant>"
    with caplog.at_level(logging.WARNING, logger="rlfactory.chat"):
        assert template.delta_after_turn(context, tool("ERRbad"), "</assistant>") == "<tool>!bad</tool><assistant>"
    assert sum("rendered in full" in r.message for r in caplog.records) == 1
    renders = counting(template)
    assert template.delta_after_turn(context, tool("ERRx"), "</assistant>") == "<tool>!x</tool><assistant>"
    assert len(renders) == 1
