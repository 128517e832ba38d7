"""Weight sync from the learner to generation servers: real `rlfactory serve` apps on loopback
ports get the learner's exact weights (full or LoRA-merged) and version, through tensors over
HTTP or a checkpoint folder; a failing server is marked stale and the rest go on; the vLLM NCCL
method sends vLLM's documented control-plane sequence (the NCCL broadcast itself needs GPUs)."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rlfactory.config import SamplingConfig
from rlfactory.protocols import GenRequest
from rlfactory.generation.server_generator import ServerGenerator
from rlfactory.serve.app import build_app
from rlfactory.serve.process import free_port
from rlfactory.serve.served import ServedModel
from rlfactory.serve.thread import AppThread
from rlfactory.train.policy_weights import policy_tensors
from rlfactory.train.weight_sync import ServerWeightSync, make_weight_sync
from rlfactory.train.weight_sync_vllm import VllmNccl

FIXTURES = Path(__file__).resolve().parents[1] / "generation" / "fixtures"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def servers(tiny):
    """Two `rlfactory serve` apps, each with its own copy of the tiny model."""
    model, tok = tiny
    served = [ServedModel(copy.deepcopy(model), tok, name="tiny:1m", pad_id=0) for _ in range(2)]
    threads = [AppThread(build_app(s)).start() for s in served]
    yield served, [t.url for t in threads]
    for t in threads:
        t.stop()
    for s in served:
        s.close()


def trained(model, seed=3):
    """A copy of `model` with moved weights (as after an update)."""
    policy = copy.deepcopy(model)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return policy


def same_weights(a, b) -> bool:
    pa = dict(a.named_parameters())
    return all(torch.equal(p, pa[n]) for n, p in b.named_parameters())


def run_with(g: ServerGenerator, coro):
    async def main():
        try:
            return await coro
        finally:
            await g.aclose()
    return asyncio.run(main())


@pytest.mark.parametrize("method", ["auto", "tensors", "disk"])
def test_push_gives_every_server_the_learners_weights_and_version(servers, tiny, tmp_path, method):
    served, urls = servers
    policy = trained(tiny[0])
    g = ServerGenerator(urls, "vllm", tiny[1], [], timeout_s=60)
    sync = ServerWeightSync(g, method, tmp_path / "sync")

    async def main():
        metrics = await sync.push(policy, 1)
        res = await g.submit(GenRequest([5, 6, 7], 3, SamplingConfig()))
        again = await sync.ensure(policy, 1)  # already there: nothing sent
        return metrics, res, again

    metrics, res, again = run_with(g, main())
    assert metrics["weight_sync/ok"] == 2 and metrics["weight_sync/failed"] == 0 and metrics["weight_sync/mb"] > 1
    assert all(same_weights(policy, s.model) and s.version == 1 for s in served)
    assert sync.versions == {u: 1 for u in urls} and res.policy_version == 1 and again == {}
    assert sorted(metrics) == ["weight_sync/failed", "weight_sync/mb", "weight_sync/ok", "weight_sync/prepare_s",
                               "weight_sync/seconds"]  # the names every weight sync uses (rlfactory.protocols)
    if method == "disk":
        assert [p.name for p in (tmp_path / "sync").iterdir()] == ["policy_v000001"]


def test_disk_sync_keeps_only_the_current_checkpoint_folder(servers, tiny, tmp_path):
    served, urls = servers
    g = ServerGenerator(urls, "sglang", tiny[1], [], timeout_s=60)
    sync = ServerWeightSync(g, "disk", tmp_path)

    async def main():
        await sync.push(trained(tiny[0], 1), 1)
        await sync.push(trained(tiny[0], 2), 2)

    run_with(g, main())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy_v000002"]
    assert all(s.version == 2 for s in served)


def test_a_lora_policy_is_pushed_merged_and_left_unmerged(servers, tiny):
    from peft import LoraConfig, get_peft_model

    served, urls = servers
    policy = get_peft_model(copy.deepcopy(tiny[0]), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # a trained adapter (B starts at zero)
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        before = policy(x).logits
    g = ServerGenerator(urls, "vllm", tiny[1], [], timeout_s=60)
    run_with(g, ServerWeightSync(g, "tensors").push(policy, 4))
    with torch.no_grad():
        assert torch.allclose(policy(x).logits, before, atol=1e-6)  # adapters unmerged again
        assert torch.allclose(served[0].model(x).logits, before, atol=1e-4)  # the server runs the merged weights
    assert not same_weights(tiny[0], served[0].model)


def test_a_server_that_cannot_be_updated_is_stale_and_the_others_serve(servers, tiny, capsys):
    served, urls = servers
    dead = f"http://127.0.0.1:{free_port()}"
    g = ServerGenerator([dead, urls[0]], "vllm", tiny[1], [], timeout_s=30)
    sync = ServerWeightSync(g, "tensors")

    async def main():
        metrics = await sync.push(trained(tiny[0]), 1)
        results = [await g.submit(GenRequest([5, 6], 2, SamplingConfig(), session=f"t{i}")) for i in range(3)]
        return metrics, results

    metrics, results = run_with(g, main())
    assert metrics["weight_sync/ok"] == 1 and metrics["weight_sync/failed"] == 1
    assert sync.versions == {dead: None, urls[0]: 1} and all(r.policy_version == 1 for r in results)
    assert f"weight sync (tensors) to {dead} failed" in capsys.readouterr().err


def test_auto_uses_the_page_cache_on_this_machine_and_http_elsewhere(tmp_path):
    g = ServerGenerator(["http://127.0.0.1:1", "http://10.1.2.3:8000", "http://localhost:2"], "vllm", None)
    for s in g.servers:
        s.kind = "rlfactory"
    assert [ServerWeightSync(g, "auto", tmp_path)._method_for(s).name for s in g.servers] == ["disk", "tensors", "disk"]
    assert ServerWeightSync(g, "auto")._method_for(g.servers[0]).name == "tensors"  # no folder to share
    sglang = ServerGenerator(["http://10.0.0.1:30000"], "sglang", None)
    sglang.servers[0].kind = "other"
    assert ServerWeightSync(sglang, "auto", tmp_path)._method_for(sglang.servers[0]).name == "disk"


def test_make_weight_sync_only_for_the_server_backend(tmp_path):
    from rlfactory.config import RunConfig

    cfg = RunConfig.model_validate({"generator": {"backend": "server", "urls": ["http://127.0.0.1:1"]},
                                    "trainer": {"run_dir": str(tmp_path)}})
    g = ServerGenerator(cfg.generator.urls, "vllm", None)
    sync = make_weight_sync(cfg, g)
    assert isinstance(sync, ServerWeightSync) and sync._methods["disk"].sync_dir == (tmp_path / "weight_sync").resolve()
    assert make_weight_sync(RunConfig(), object()) is None
    cfg.generator.weight_sync = "none"
    assert make_weight_sync(cfg, g) is None


class RecordingVllm:
    """vLLM's weight-transfer routes as documented (answers from the fixture), recording calls."""

    def __init__(self) -> None:
        self.doc = json.loads((FIXTURES / "vllm_weight_transfer_nccl.json").read_text())
        answers = {c["path"]: c["response"] for c in self.doc["calls"]}
        self.calls: list[tuple[str, str, dict, dict]] = []

        async def handle(request: Request) -> JSONResponse:
            raw = await request.body()
            self.calls.append((request.method, request.url.path, dict(request.query_params), json.loads(raw) if raw else {}))
            return JSONResponse(answers[request.url.path])

        routes = [Route(c["path"], handle, methods=[c["method"]]) for c in self.doc["calls"]]
        self.thread = AppThread(Starlette(routes=routes))


class RecordingTransport:
    def __init__(self) -> None:
        self.joined: list[tuple[str, int, int]] = []
        self.sent: list[list[str]] = []

    def join(self, master_address, master_port, world_size):
        self.joined.append((master_address, master_port, world_size))
        return "group"

    def send(self, group, named_tensors):
        assert group == "group"
        self.sent.append([n for n, _ in named_tensors])


def test_vllm_nccl_sync_sends_vllms_documented_control_plane_sequence(tiny):
    vllm = RecordingVllm()
    transport = RecordingTransport()
    policy = trained(tiny[0])
    with vllm.thread:
        g = ServerGenerator([vllm.thread.url], "vllm", tiny[1], [], timeout_s=30)
        g.servers[0].kind = "other"  # a vLLM server
        sync = ServerWeightSync(g, "auto", nccl=VllmNccl(g, transport=transport))

        async def main():
            await sync.push(policy, 1)
            await sync.push(policy, 2)

        run_with(g, main())
    doc_order = [c["path"] for c in vllm.doc["calls"]]
    per_update = doc_order[2:]
    assert [c[1] for c in vllm.calls] == doc_order + per_update  # the group is set up once
    _, _, _, init = vllm.calls[1]
    assert init["init_info"]["rank_offset"] == 1 and init["init_info"]["world_size"] == 2
    assert transport.joined == [("127.0.0.1", init["init_info"]["master_port"], 2)]
    assert [c[2] for c in vllm.calls if c[1] == "/pause"] == [{"mode": "wait"}] * 2
    info = next(c[3] for c in vllm.calls if c[1] == "/update_weights")["update_info"]
    names = list(policy_tensors(policy))
    assert info["names"] == names and info["packed"] is True
    assert info["dtype_names"] == ["float32"] * len(names)
    assert info["shapes"] == [list(p.shape) for p in policy_tensors(policy).values()]
    assert [c[3] for c in vllm.calls if c[1] == "/finish_weight_update"] == [{"weight_version": "1"}, {"weight_version": "2"}]
    assert transport.sent == [names, names] and sync.versions == {vllm.thread.url: 2}


def test_the_three_weight_syncs_are_one_protocol():
    from rlfactory.distributed.weights import RayWeightSync
    from rlfactory.protocols import WeightSync
    from rlfactory.train.async_pipeline import LocalWeightSync

    assert all(issubclass(cls, WeightSync) for cls in (ServerWeightSync, RayWeightSync, LocalWeightSync))
    assert not issubclass(int, WeightSync)
