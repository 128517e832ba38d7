"""VerlGenerator against a recording server manager with verl's `generate` signature (see
verl_fakes.py for the quoted source); the same generator against the real tiny model is in
test_integrations_verl_rollout.py."""

from __future__ import annotations

import asyncio
import math
from typing import Any, Optional

import pytest
from verl_fakes import TokenOutput

from rlfactory.integrations.verl.generator import GenerationAborted, VerlGenerator, finish_of
from rlfactory.protocols import GenRequest

VERL_SAMPLING = dict(temperature=0.7, top_p=0.9, top_k=-1, repetition_penalty=1.0, logprobs=True)


class CharTok:
    def decode(self, ids, skip_special_tokens=False):
        return "".join("<eot>" if i == 0 else chr(i) for i in ids)


class Recording:
    """verl's LLMServerClient.generate signature; returns the queued outputs in order."""

    def __init__(self, outputs: list[TokenOutput]) -> None:
        self.outputs = list(outputs)
        self.seen: list[dict[str, Any]] = []

    async def generate(self, request_id, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Optional[list[Any]] = None, video_data: Optional[list[Any]] = None,
                       audio_data: Optional[list[Any]] = None, mm_processor_kwargs: Optional[dict[str, Any]] = None,
                       **kwargs: Any) -> TokenOutput:
        self.seen.append(dict(request_id=request_id, prompt_ids=prompt_ids, sampling_params=dict(sampling_params)))
        sampling_params.pop("max_tokens")  # verl's vLLM server pops it: the generator must pass a copy
        return self.outputs.pop(0)


def submit(gen: VerlGenerator, request: GenRequest):
    return asyncio.run(gen.submit(request))


def test_one_request_id_per_trajectory_and_verl_sampling_plus_the_turn_limits():
    server = Recording([TokenOutput([104, 105, 0], [-0.5, -0.25, -0.125], stop_reason="completed", num_preempted=1),
                        TokenOutput([106, 0], [-1.0, -2.0], stop_reason="completed", num_preempted=0)])
    gen = VerlGenerator(server, VERL_SAMPLING, CharTok())
    first = submit(gen, GenRequest([1, 2, 3], max_new_tokens=50, stop_token_ids=[0], stop_strings=["</call>"]))
    second = submit(gen, GenRequest([1, 2, 3, 104, 105, 0, 9], max_new_tokens=7, stop_token_ids=[0]))
    assert [s["request_id"] for s in server.seen] == [gen.request_id] * 2
    assert server.seen[0]["sampling_params"] == {**VERL_SAMPLING, "max_tokens": 50, "stop_token_ids": [0],
                                                 "stop": ["</call>"]}
    assert server.seen[1]["prompt_ids"] == [1, 2, 3, 104, 105, 0, 9]
    assert server.seen[1]["sampling_params"]["max_tokens"] == 7
    assert "stop" not in server.seen[1]["sampling_params"]  # no stop strings: no `stop` key
    assert gen.sampling_params == VERL_SAMPLING  # verl's dict is not changed by the turns
    assert (first.token_ids, first.logprobs, first.finish_reason, first.stop_token) == (
        [104, 105, 0], [-0.5, -0.25, -0.125], "stop", 0)
    assert first.text == "hi<eot>" and second.text == "j<eot>"
    assert gen.calls == 2 and gen.num_preempted == 1 and gen.generate_s > 0
    assert VerlGenerator(server, VERL_SAMPLING, CharTok()).request_id != gen.request_id


def test_logprobs_nan_when_verl_did_not_ask_and_an_error_when_asked_and_missing():
    gen = VerlGenerator(Recording([TokenOutput([104, 0], None)]), {**VERL_SAMPLING, "logprobs": False}, CharTok())
    assert all(math.isnan(x) for x in submit(gen, GenRequest([1], 8, stop_token_ids=[0])).logprobs)
    assert not gen.wants_logprobs
    gen = VerlGenerator(Recording([TokenOutput([104, 0], None)]), VERL_SAMPLING, CharTok())
    with pytest.raises(ValueError, match="returned none logprobs for 2 tokens"):
        submit(gen, GenRequest([1], 8, stop_token_ids=[0]))
    gen = VerlGenerator(Recording([TokenOutput([104, 0], [-1.0])]), VERL_SAMPLING, CharTok())
    with pytest.raises(ValueError, match="returned 1 logprobs for 2 tokens"):
        submit(gen, GenRequest([1], 8, stop_token_ids=[0]))


def test_an_aborted_turn_raises():
    gen = VerlGenerator(Recording([TokenOutput([104], [-1.0], stop_reason="aborted")]), VERL_SAMPLING, CharTok())
    with pytest.raises(GenerationAborted, match=gen.request_id):
        submit(gen, GenRequest([1], 8, stop_token_ids=[0]))


@pytest.mark.parametrize("ids, text, stops, max_tokens, expected", [
    ([5, 6, 0], "ab<eot>", [], 8, ("stop", 0)),            # a stop token last
    ([5, 6, 7], "a</call>", ["</call>"], 3, ("stop", None)),  # a stop string, even at max_tokens
    ([5, 6, 7], "abc", [], 3, ("length", None)),            # max_tokens reached
    ([5, 6], "ab", [], 8, ("stop", None)),                  # the server stopped on its own EOS
])
def test_finish_reason_from_the_tokens(ids, text, stops, max_tokens, expected):
    assert finish_of(ids, text, [0], stops, max_tokens) == expected
