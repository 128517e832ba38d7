"""Images through the rollout engine: a row's question with a picture, a real MCP server's tool
returning two pictures, the `qwen2_5_vl` ToolManager of the tiny VL model; the prompt and observation
segments carry their images, the loss mask is 1 exactly on model tokens, truncation drops whole
images, and the trajectories' JSON lines round-trip with their images.

The generator here replays scripted model turns (their ids as the model would sample them): the
local generator's vision prefill is other work; everything else is real."""

from __future__ import annotations

import asyncio
import base64
import io
import sys

import pytest
from PIL import Image as PILImage
from transformers import AutoTokenizer

from rlfactory.chat.qwen_vl import QwenVLToolManager
from rlfactory.chat.template import ModelTurn
from rlfactory.chat.vision import DROPPED_NOTE
from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.rollout.engine import RolloutEngine
from rlfactory.protocols import GenRequest, GenResult
from rlfactory.tiny.vl import make_tiny_vl_model
from rlfactory.tools import ToolCall, ToolResult, ToolRunner
from rlfactory.tools.servers.pictures import picture_png
from rlfactory.trajectory import read_jsonl, write_jsonl

PICTURES = {"mcpServers": {"pics": {"command": sys.executable, "args": ["-m", "rlfactory.tools.servers.pictures"]}}}


@pytest.fixture(scope="module")
def tm(tmp_path_factory):
    folder = make_tiny_vl_model(tmp_path_factory.mktemp("tinyvl") / "m", "1m", seed=0)
    return QwenVLToolManager(AutoTokenizer.from_pretrained(folder), enable_thinking=False)


class TurnGenerator:
    """Turn 1: a call of `pictures`; turn 2: an answer. Ids as `model_turn_ids` gives them."""

    def __init__(self, tm: QwenVLToolManager) -> None:
        self.tm, self.tokenizer = tm, tm.tokenizer
        self.requests: list[GenRequest] = []

    async def submit(self, req: GenRequest) -> GenResult:
        self.requests.append(req)
        first = self.tm.template.token_id("<tool_response>") not in req.prompt_ids
        turn = ModelTurn([ToolCall("pictures", {"count": 2, "size": 64})]) if first else ModelTurn([], "red")
        ids = self.tm.model_turn_ids(turn)
        return GenResult(ids, [-0.5] * len(ids), "stop", self.tokenizer.decode(ids), ids[-1])

    async def generate(self, reqs):
        return [await self.submit(r) for r in reqs]


def rollout(tm, max_observation_tokens: int):
    png = io.BytesIO()
    PILImage.new("RGB", (32, 24), (0, 0, 200)).save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is in the pictures?"},
                                                     {"type": "image", "image": url}]}]}

    async def main():
        async with ToolRunner(mcp=PICTURES) as runner:
            engine = RolloutEngine(TurnGenerator(tm), tm, runner, None,
                                   RolloutConfig(max_observation_tokens=max_observation_tokens), SamplingConfig())
            return await engine.run([row], 1)

    (traj,) = asyncio.run(main())
    return traj, png.getvalue()


def test_a_rollout_keeps_its_images_on_their_segments_and_round_trips(tm, tmp_path):
    traj, png = rollout(tm, 512)
    assert traj.status == "ok" and [s.role for s in traj.segments] == ["prompt", "model", "observation", "model"]
    prompt, call, obs, answer = traj.segments
    assert [im.data for im in prompt.images] == [png]
    assert [im.data for im in obs.images] == [picture_png(0, 64), picture_png(1, 64)]
    assert call.images is None and answer.images is None
    for seg in (prompt, obs):  # each segment holds exactly its images' pads
        assert seg.token_ids.count(tm.pad_id) == sum(tm.image_tokens(im) for im in seg.images)
    assert traj.loss_mask == [1 if s.role == "model" else 0 for s in traj.segments for _ in s.token_ids]
    write_jsonl(tmp_path / "t.jsonl", [traj])
    assert read_jsonl(tmp_path / "t.jsonl") == [traj]


def test_an_observation_too_small_for_both_pictures_drops_the_second_whole(tm):
    full, _ = rollout(tm, 512)
    per = tm.image_tokens(full.segments[2].images[0])
    # Images come before text: room for both pictures once the text is cut is room enough ...
    traj, _ = rollout(tm, len(full.segments[2].token_ids) - per // 2)
    assert len(traj.segments[2].images) == 2 and traj.tool_calls[0].truncated
    # ... but where even the bare pictures do not fit, the last one goes, whole.
    bare = len(tm.render_observation([ToolResult("", images=full.segments[2].images)]))
    traj, _ = rollout(tm, bare - per // 2)
    obs = traj.segments[2]
    assert [im.data for im in obs.images] == [picture_png(0, 64)]
    assert obs.token_ids.count(tm.pad_id) == per and DROPPED_NOTE in obs.text
    assert traj.status == "ok"
