"""Our qwen3 prompt for a BFCL entry against BFCL's own Qwen FC handler (`QwenFCHandler._format_prompt`,
which bfcl-eval uses for Qwen3-*-FC): token for token the same outside the list of functions. Inside
it the two differ by design, and this test pins how: rlfactory gives the chat template the OpenAI
form (`{"type": "function", "function": ...}`, JSON-schema types, BFCL's own conversion), BFCL's
handler dumps its raw function docs (types such as `dict`)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("bfcl_eval")
pytest.importorskip("overrides")  # bfcl-eval's model handlers import it

from rlfactory.chat import make_tool_manager  # noqa: E402
from rlfactory.envs.bfcl.data import load_category  # noqa: E402
from rlfactory.envs.bfcl.package import bfcl  # noqa: E402
from rlfactory.rollout.engine import row_tool_specs  # noqa: E402

TOOLS = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)


@pytest.mark.parametrize("category", ["simple_python", "multiple", "parallel_multiple", "live_simple"])
def test_same_prompt_tokens_as_bfcls_qwen_fc_handler_outside_the_tool_list(qwen3_tokenizer, category):
    bfcl()
    from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler

    handler = QwenFCHandler.__new__(QwenFCHandler)  # _format_prompt reads no handler state
    tm = make_tool_manager(qwen3_tokenizer, "qwen3")
    for row in load_category(category, limit=3):
        ours = tm.render_prompt(row["messages"], row_tool_specs(row, []))
        theirs_text = handler._format_prompt(row["messages"], row["functions"])
        ours_text = qwen3_tokenizer.decode(ours)
        assert TOOLS.sub("<tools/>", ours_text) == TOOLS.sub("<tools/>", theirs_text), row["id"]
        ours_tools = [json.loads(x) for x in TOOLS.search(ours_text).group(1).split("\n")]
        theirs_tools = [json.loads(x) for x in TOOLS.search(theirs_text).group(1).split("\n")]
        assert [t["function"]["name"] for t in ours_tools] == [t["name"] for t in theirs_tools]
        assert [t["function"]["description"] for t in ours_tools] == [t["description"] for t in theirs_tools]
        assert all(t["function"]["parameters"]["type"] == "object" for t in ours_tools)
        assert all(t["parameters"]["type"] == "dict" for t in theirs_tools)
