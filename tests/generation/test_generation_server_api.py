"""The server backend's wire formats against vLLM's and SGLang's documented shapes (fixtures in
tests/generation/fixtures, each naming its source): the request body the client builds is the
fixture's request, and every fixture answer parses into exactly its token ids and logprobs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from rlfactory.config import SamplingConfig
from rlfactory.protocols import GenRequest
from rlfactory.generation.server_api import MalformedResponse, build_request, parse_response

FIXTURES = Path(__file__).parent / "fixtures"
IM_END, EOT = 151645, 151643


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def request_of(fx: dict, api: str) -> tuple[GenRequest, list[int], list[str]]:
    """The GenRequest and stops that a fixture's request body stands for."""
    body = fx["request"]
    params = body if api == "vllm" else body["sampling_params"]
    prompt = body["prompt"] if api == "vllm" else body["input_ids"]
    max_new = params["max_tokens"] if api == "vllm" else params["max_new_tokens"]
    return GenRequest(prompt, max_new, SamplingConfig(temperature=params["temperature"])), params["stop_token_ids"], params["stop"]


def test_fixtures_name_their_sources():
    for path in FIXTURES.glob("*.json"):
        fx = json.loads(path.read_text())
        assert fx["sources"] and all(s["repository"] in ("vllm-project/vllm", "sgl-project/sglang") and s["path"]
                                     for s in fx["sources"]), path.name
        assert all(s.get("commit") or s.get("commit_note") for s in fx["sources"]), path.name


@pytest.mark.parametrize("name", ["vllm_completions_stop_token.json", "vllm_completions_eos.json",
                                  "vllm_completions_stop_string.json", "vllm_completions_length.json"])
def test_vllm_request_body_is_the_documented_one(name):
    fx = fixture(name)
    req, stop_ids, stops = request_of(fx, "vllm")
    assert build_request("vllm", req, stop_ids, stops, model=fx["request"]["model"]) == fx["request"]


@pytest.mark.parametrize("name", ["sglang_generate_stop.json", "sglang_generate_length.json",
                                  "sglang_generate_stop_string.json"])
def test_sglang_request_body_is_the_documented_one(name):
    fx = fixture(name)
    req, stop_ids, stops = request_of(fx, "sglang")
    assert build_request("sglang", req, stop_ids, stops) == fx["request"]


def test_request_fields_for_greedy_top_k_seed_session_and_no_stop_tokens():
    req = GenRequest([1, 2], 5, SamplingConfig(temperature=0.7, top_p=0.9, top_k=20, greedy=True), session="traj-1")
    v = build_request("vllm", req, [], ["</a>"], seed=11, session="traj-1")
    assert (v["temperature"], v["top_p"], v["top_k"], v["seed"], v["session_id"]) == (0.0, 0.9, 20, 11, "traj-1")
    assert v["ignore_eos"] is True and v["stop_token_ids"] == [] and v["stop"] == ["</a>"] and "model" not in v
    s = build_request("sglang", req, [], [], seed=11)
    p = s["sampling_params"]
    assert (p["temperature"], p["top_k"], p["sampling_seed"], p["ignore_eos"]) == (0.0, 20, 11, True)
    assert "session_id" not in s  # only sent to servers that understand it


@pytest.mark.parametrize("name,ids,finish,stop_token", [
    ("vllm_completions_stop_token.json", [19, 17, IM_END], "stop", IM_END),
    ("vllm_completions_eos.json", [19, 17, EOT], "stop", EOT),  # EOS: stop_reason null, the id is the last token
    ("vllm_completions_length.json", [40, 1184, 311, 11047], "length", None),
])
def test_vllm_answers_parse_into_token_ids_and_logprobs(name, ids, finish, stop_token):
    fx = fixture(name)
    turn = parse_response("vllm", fx["response"], fx["request"]["stop_token_ids"])
    choice = fx["response"]["choices"][0]
    assert turn.token_ids == ids == choice["token_ids"]
    assert turn.logprobs == choice["logprobs"]["token_logprobs"]
    assert (turn.finish_reason, turn.stop_token, turn.policy_version) == (finish, stop_token, None)


def test_vllm_stop_string_keeps_every_sampled_token_and_no_stop_token():
    fx = fixture("vllm_completions_stop_string.json")
    turn = parse_response("vllm", fx["response"], fx["request"]["stop_token_ids"])
    assert turn.token_ids == fx["response"]["choices"][0]["token_ids"] and len(turn.token_ids) == 25
    assert turn.finish_reason == "stop" and turn.stop_token is None


@pytest.mark.parametrize("name,ids,finish,stop_token,version", [
    ("sglang_generate_stop.json", [19, 17, IM_END], "stop", IM_END, None),  # weight_version "default"
    ("sglang_generate_trimmed.json", [19, 17, IM_END], "stop", IM_END, 3),  # stop token restored from the logprobs
    ("sglang_generate_length.json", [40, 1184, 311, 11047], "length", None, 7),
    ("sglang_generate_stop_string.json", [27, 14172, 28284, 397, 6257, 198, 522, 14172, 28284, 29], "stop", None, 2),
])
def test_sglang_answers_parse_into_token_ids_logprobs_and_version(name, ids, finish, stop_token, version):
    fx = fixture(name)
    turn = parse_response("sglang", fx["response"], fx["request"]["sampling_params"]["stop_token_ids"])
    assert turn.token_ids == ids
    assert turn.logprobs == [row[0] for row in fx["response"]["meta_info"]["output_token_logprobs"]]
    assert (turn.finish_reason, turn.stop_token, turn.policy_version) == (finish, stop_token, version)


def _broken(name: str, edit) -> dict:
    body = copy.deepcopy(fixture(name)["response"])
    edit(body)
    return body


@pytest.mark.parametrize("api,name,edit,words", [
    ("vllm", "vllm_completions_stop_token.json", lambda b: b["choices"][0].pop("token_ids"), "return_token_ids"),
    ("vllm", "vllm_completions_stop_token.json", lambda b: b["choices"][0]["logprobs"]["token_logprobs"].pop(), "logprobs"),
    ("vllm", "vllm_completions_stop_token.json", lambda b: b["choices"][0].update(finish_reason="abort"), "finish_reason"),
    ("vllm", "vllm_completions_stop_token.json", lambda b: b["choices"][0].update(stop_reason=7), "stop_reason"),
    ("vllm", "vllm_completions_stop_token.json", lambda b: b.update(choices=[]), "one choice"),
    ("vllm", "vllm_completions_stop_token.json", lambda b: b["choices"][0].update(token_ids=["4", "2"]), "token ids"),
    ("sglang", "sglang_generate_stop.json", lambda b: b["meta_info"].pop("output_token_logprobs"), "output_token_logprobs"),
    ("sglang", "sglang_generate_stop.json", lambda b: b.update(output_ids=[1, 2, 3]), "output_ids"),
    ("sglang", "sglang_generate_stop.json", lambda b: b["meta_info"].update(finish_reason={"type": "abort"}), "finish_reason"),
    ("sglang", "sglang_generate_stop.json", lambda b: b["meta_info"]["finish_reason"].update(matched=5), "last token"),
])
def test_a_body_that_is_not_the_documented_shape_is_malformed(api, name, edit, words):
    with pytest.raises(MalformedResponse, match=words):
        parse_response(api, _broken(name, edit), [IM_END])
