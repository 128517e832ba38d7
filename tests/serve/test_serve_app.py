"""`rlfactory serve`'s HTTP app on rlfactory's real tiny model (in this process, on a loopback
port): the vLLM and SGLang answers have the documented keys and exactly the local generator's
tokens and logprobs; the client reads them; bad requests get a 400 naming the field; weight
updates from tensors and from disk change the served weights and the version, refuse a bad set
without touching the model, and never split a turn across two sets of weights."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save

from rlfactory.config import SamplingConfig
from rlfactory.protocols import GenRequest
from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.server_generator import ServerGenerator
from rlfactory.serve.app import build_app
from rlfactory.serve.served import ServedModel
from rlfactory.serve.thread import AppThread

FIXTURES = Path(__file__).resolve().parents[1] / "generation" / "fixtures"
PROMPT = [5, 6, 7, 8, 9]


pytestmark = pytest.mark.usefixtures("one_thread")


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture
def served(tiny):
    """A fresh ServedModel (its own copy of the weights) behind a real HTTP server."""
    model, tok = tiny
    s = ServedModel(copy.deepcopy(model), tok, name="tiny:1m", pad_id=0, seed=0)
    with AppThread(build_app(s)) as srv:
        s.url = srv.url
        yield s
    s.close()


def teacher_forced(model, prompt, tokens):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


def local_greedy(model, tok, n):
    gen = LocalGenerator(model, 0, (), tokenizer=tok)
    try:
        return asyncio.run(gen.submit(GenRequest(PROMPT, n, SamplingConfig(greedy=True), stop_token_ids=[]))).token_ids
    finally:
        gen.close()


def test_vllm_answer_has_the_documented_keys_and_the_local_generators_tokens(served, tiny):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 0, "return_token_ids": True,
            "ignore_eos": True}
    r = httpx.post(served.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got, doc = r.json(), fixture("vllm_completions_length.json")["response"]
    assert set(doc) <= set(got) and set(doc["choices"][0]) == set(got["choices"][0])
    assert set(doc["choices"][0]["logprobs"]) == set(got["choices"][0]["logprobs"])
    choice = got["choices"][0]
    assert choice["token_ids"] == local_greedy(tiny[0], tiny[1], 12) and choice["finish_reason"] == "length"
    assert choice["prompt_token_ids"] == PROMPT and got["policy_version"] == 0
    expected = teacher_forced(served.model, PROMPT, choice["token_ids"])
    assert torch.allclose(torch.tensor(choice["logprobs"]["token_logprobs"]), expected, atol=1e-4)


def test_sglang_answer_has_the_documented_keys(served):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
            "return_logprob": True}
    r = httpx.post(served.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got, doc = r.json(), fixture("sglang_generate_length.json")["response"]
    assert set(doc) == set(got) and set(doc["meta_info"]) <= set(got["meta_info"])
    meta = got["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6} and meta["weight_version"] == "0"
    assert [row[1] for row in meta["output_token_logprobs"]] == got["output_ids"] and len(got["output_ids"]) == 6


def test_a_stop_token_ends_the_turn_and_is_kept_last(served, tiny):
    free = local_greedy(tiny[0], tiny[1], 12)
    stop = free[3]  # greedy reaches this token at step 4
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 0, "return_token_ids": True,
            "stop_token_ids": [stop], "ignore_eos": True}
    choice = httpx.post(served.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert choice["token_ids"] == free[: free.index(stop) + 1]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop


@pytest.mark.parametrize("api", ["vllm", "sglang"])
def test_the_client_reads_both_apis_and_keeps_the_trajectorys_kv_cache(served, api):
    g = ServerGenerator([served.url], api, served.tokenizer, [], timeout_s=60)

    async def main():
        first = await g.submit(GenRequest(PROMPT, 5, SamplingConfig(greedy=True), session="traj"))
        second = await g.submit(GenRequest(PROMPT + first.token_ids + [11, 12], 5, SamplingConfig(greedy=True), session="traj"))
        kept = served.generator.kept_sessions
        g.forget("traj")
        await g.aclose()
        return first, second, kept

    first, second, kept = asyncio.run(main())
    assert len(first.token_ids) == len(second.token_ids) == 5 and first.policy_version == 0
    assert kept == 1 and served.generator.stats["reused_tokens"] > 0  # the second turn prefilled only new tokens
    assert served.generator.kept_sessions == 0  # forget released it on the server


@pytest.mark.parametrize("path,body,field", [
    ("/v1/completions", {"prompt": "hello"}, "`prompt`"),
    ("/v1/completions", {"prompt": [[1, 2], [3]]}, "`prompt`"),
    ("/v1/completions", {"prompt": [1, 2], "n": 2}, "`n`"),
    ("/v1/completions", {"prompt": [1, 2], "stream": True}, "`stream`"),
    ("/v1/completions", {"prompt": [1, 2], "logprobs": 5}, "`logprobs`"),
    ("/v1/completions", {"prompt": [1, 2], "max_tokens": 10**6}, "context"),
    ("/v1/completions", {"prompt": [1, 2], "top_p": 0}, "top_p"),
    ("/generate", {"text": "hello"}, "`input_ids`"),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"n": 3}}, "`sampling_params.n`"),
    ("/generate", {"input_ids": [1, 2], "top_logprobs_num": 2}, "`top_logprobs_num`"),
    ("/v1/completions", {"prompt": [1, 10**6]}, "`prompt` holds token id 1000000, outside the model's vocabulary"),
    ("/generate", {"input_ids": [1, 10**6]}, "`input_ids` holds token id 1000000"),
    ("/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid JSON"),
])
def test_a_request_outside_the_subset_gets_a_400_naming_the_field(served, path, body, field):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(served.url + path, content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and field in r.json()["error"]["message"]


def perturbed(model, seed=1):
    torch.manual_seed(seed)
    return {n: p.detach() + 0.05 * torch.randn_like(p) for n, p in model.named_parameters()}


def test_an_update_from_tensors_changes_the_weights_and_the_version(served):
    new = perturbed(served.model)
    r = httpx.post(served.url + "/update_weights_from_tensors", params={"policy_version": 5}, content=save(new), timeout=60)
    assert r.status_code == 200 and r.json()["success"] and r.json()["policy_version"] == 5
    assert all(torch.equal(p, new[n]) for n, p in served.model.named_parameters())
    got = httpx.post(served.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "logprobs": 0,
                                                            "return_token_ids": True}, timeout=60).json()
    assert got["policy_version"] == 5
    assert httpx.get(served.url + "/health").json()["policy_version"] == 5
    assert httpx.get(served.url + "/get_weight_version").json() == {"weight_version": "5"}


@pytest.mark.parametrize("edit,words", [
    (lambda t: t.pop("model.norm.weight"), "missing"),
    (lambda t: t.update(extra=torch.zeros(2)), "unknown"),
    (lambda t: t.update({"model.norm.weight": torch.zeros(3)}), "wrong shape"),
])
def test_a_bad_weight_set_is_refused_and_the_model_is_unchanged(served, edit, words):
    before = {n: p.clone() for n, p in served.model.named_parameters()}
    tensors = perturbed(served.model)
    edit(tensors)
    r = httpx.post(served.url + "/update_weights_from_tensors", params={"policy_version": 1}, content=save(tensors), timeout=60)
    assert r.status_code == 400 and not r.json()["success"] and words in r.json()["message"]
    assert all(torch.equal(p, before[n]) for n, p in served.model.named_parameters()) and served.version == 0


def test_a_body_that_is_not_safetensors_is_refused(served):
    r = httpx.post(served.url + "/update_weights_from_tensors", content=b"\x00garbage", timeout=60)
    assert r.status_code == 400 and "safetensors" in r.json()["message"] and served.version == 0


def test_an_update_from_disk_has_sglangs_shape(served, tmp_path):
    model = copy.deepcopy(served.model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(perturbed(served.model)[n])
    model.save_pretrained(tmp_path / "v2")
    doc = fixture("sglang_update_weights_from_disk.json")
    r = httpx.post(served.url + "/update_weights_from_disk", json={**doc["request"], "model_path": str(tmp_path / "v2"),
                                                                     "weight_version": "2"}, timeout=60)
    assert r.status_code == 200 and set(doc["response"]) <= set(r.json()) and r.json()["success"] is True
    assert served.version == 2
    assert all(torch.equal(p, dict(model.named_parameters())[n]) for n, p in served.model.named_parameters())
    bad = httpx.post(served.url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "nope")}, timeout=60)
    assert bad.status_code == 400 and set(doc["failure_response"]) <= set(bad.json()) and bad.json()["success"] is False
    assert served.version == 2


def test_an_update_waits_for_the_turn_in_flight_which_keeps_the_old_weights(served):
    """A long turn is generating when an update arrives: the update waits; every logprob of the
    turn is the old model's, its reported version is the old one; the next turn is the new model's."""
    old_model = copy.deepcopy(served.model)
    new = perturbed(served.model)
    long_turn = {"prompt": PROMPT, "max_tokens": 200, "logprobs": 0, "return_token_ids": True, "ignore_eos": True}
    answers: dict[str, dict] = {}

    def generate():
        answers["long"] = httpx.post(served.url + "/v1/completions", json=long_turn, timeout=300).json()

    worker = threading.Thread(target=generate)
    worker.start()
    deadline = time.monotonic() + 120
    while served.active == 0:  # the turn has started generating
        assert time.monotonic() < deadline and worker.is_alive(), "the long turn never started"
        time.sleep(0.01)
    update = httpx.post(served.url + "/update_weights_from_tensors", params={"policy_version": 1}, content=save(new), timeout=300)
    worker.join()
    assert update.json()["success"] and served.updates_waited == 1
    long = answers["long"]
    tokens = long["choices"][0]["token_ids"]
    assert long["policy_version"] == 0 and len(tokens) == 200
    assert torch.allclose(torch.tensor(long["choices"][0]["logprobs"]["token_logprobs"]),
                          teacher_forced(old_model, PROMPT, tokens), atol=1e-4)
    after = httpx.post(served.url + "/v1/completions", json={**long_turn, "max_tokens": 8}, timeout=60).json()
    assert after["policy_version"] == 1
    assert torch.allclose(torch.tensor(after["choices"][0]["logprobs"]["token_logprobs"]),
                          teacher_forced(served.model, PROMPT, after["choices"][0]["token_ids"]), atol=1e-4)


def test_info_routes(served):
    assert httpx.get(served.url + "/policy_version").json() == {"policy_version": 0}
    assert httpx.get(served.url + "/v1/models").json()["data"][0]["id"] == "tiny:1m"
    health = httpx.get(served.url + "/health").json()
    assert health["server"] == "rlfactory" and health["status"] == "ok"
