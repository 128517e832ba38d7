"""Small fakes for the rollout unit tests: a char-level tokenizer and ToolManager, a scripted
generator, and a ToolRunner stand-in. Tests of the real parts live next to these."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import torch

from rlfactory.chat.base import Answer, Malformed, ToolCalls
from rlfactory.envs.base import Env
from rlfactory.protocols import GenRequest, GenResult
from rlfactory.tools.base import ToolCall, ToolResult, ToolSpec

EOT = 256  # end of turn


class CharTokenizer:
    """id = code point for chars < 256; 256 is the end-of-turn token."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join("" if i == EOT and skip_special_tokens else "<eot>" if i == EOT else chr(i) for i in ids)

    def __len__(self) -> int:
        return 257


class CharToolManager:
    """Prompt `U:<text>\\nA:`; a call is `CALL name {json}`; observations `\\nT:<text>\\nA:`."""

    family = "chars"

    def __init__(self) -> None:
        self.tok = CharTokenizer()

    def render_prompt(self, messages, tools) -> list[int]:
        names = ",".join(t.name for t in tools)
        return self.tok.encode(f"[{names}]" + "".join(f"U:{m['content']}" for m in messages) + "\nA:")

    def parse(self, text: str):
        if "CALL" not in text:
            return Answer(text)
        m = re.fullmatch(r"\s*CALL (\w+) (\{.*\})\s*", text, re.S)
        if not m:
            return Malformed("could not parse the call")
        try:
            args = json.loads(m.group(2))
        except json.JSONDecodeError as e:
            return Malformed(f"bad json: {e}")
        return ToolCalls([ToolCall(m.group(1), args)])

    def render_observation(self, results) -> list[int]:
        return self.tok.encode("".join(f"\nT:{r.text}" for r in results) + "\nA:")

    def stop_token_ids(self) -> list[int]:
        return [EOT]

    def stop_strings(self) -> list[str]:
        return []


class ScriptedGenerator:
    """Answers each request with the next scripted turn of its trajectory.

    `script(prompt_text) -> str` gives the turn's text from the whole context so far. Text ending in
    `<eot>` ends with the stop token; otherwise the turn is cut at max_new_tokens ("length").
    """

    def __init__(self, script) -> None:
        self.script = script
        self.tokenizer = CharTokenizer()
        self.requests: list[GenRequest] = []

    async def submit(self, req: GenRequest) -> GenResult:
        self.requests.append(req)
        await asyncio.sleep(0)
        text = self.script(self.tokenizer.decode(req.prompt_ids))
        stop = text.endswith("<eot>")
        ids = self.tokenizer.encode(text[:-5] if stop else text) + ([EOT] if stop else [])
        reason = "stop" if stop else "length"
        if len(ids) >= req.max_new_tokens:
            ids, reason, stop = ids[: req.max_new_tokens], "length", False
        return GenResult(ids, [-0.5] * len(ids), reason, self.tokenizer.decode(ids), EOT if stop else None)

    async def generate(self, reqs):
        return list(await asyncio.gather(*(self.submit(r) for r in reqs)))


class FakeRunner:
    """Stand-in for rlfactory.tools.ToolRunner: `echo` returns its text; results from `table`."""

    def __init__(self, table: dict[str, ToolResult] | None = None) -> None:
        self.table = table or {}
        self.calls: list[ToolCall] = []

    def specs(self) -> list[ToolSpec]:
        return [ToolSpec("echo", "echo text", {"type": "object", "properties": {"text": {"type": "string"}}})]

    async def run(self, calls: list[ToolCall]) -> list[ToolResult]:
        self.calls += calls
        out = []
        for c in calls:
            key = str(c.arguments.get("text"))
            out.append(self.table.get(key) or ToolResult(f"echo:{key}", latency_s=0.01))
        return out


class RowsEnv(Env):
    """A minimal env: the row's `question` is the user message; tools run through the runner."""

    max_turns = 4

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": row["question"]}]


def one_torch_thread():
    """Module fixture body: one intra-op thread (tiny models gain nothing from more, and on a
    shared CPU the thread pool's barriers stall badly); restores the setting afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
