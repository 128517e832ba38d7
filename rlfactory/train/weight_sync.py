"""Weight sync: after each policy update the learner pushes its weights to every generation server
(server backend) and records the version each server holds.

Per server, the method is `generator.weight_sync` (auto: for `rlfactory serve` disk when it runs
on this machine (a loopback URL), else tensors; disk for SGLang; nccl for vLLM):
  tensors  the weights as one safetensors body, `POST /update_weights_from_tensors?policy_version=N`
           (`rlfactory serve`).
  disk     the weights written once as a checkpoint folder under `sync_dir` (model.safetensors +
           config.json), then `POST /update_weights_from_disk {"model_path", "weight_version"}`
           (SGLang's route; `rlfactory serve` has it too). Every server must see the same path.
  nccl     vLLM's weight-transfer routes with an NCCL broadcast (weight_sync_vllm.py; GPUs).
While a server is updated the ServerGenerator sends it no turns and the update starts once the turns
in flight there have come back (`hold` / `release`), so a model segment never mixes versions. A
server whose update fails is marked stale (no turns) until a later push succeeds; the run goes on.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from rlfactory.config import RunConfig
from rlfactory.protocols import (WEIGHT_SYNC_FAILED, WEIGHT_SYNC_MB, WEIGHT_SYNC_OK, WEIGHT_SYNC_PREPARE_S,
                                 WEIGHT_SYNC_SECONDS, Generator)
from rlfactory.generation.server_generator import ServerGenerator, ServerState
from rlfactory.train.policy_weights import config_of, policy_tensors


class SyncMethod(Protocol):
    name: str

    async def prepare(self, policy: nn.Module, version: int) -> Any:
        """Build what is sent (once per update, for every server)."""
        ...

    async def send(self, server: ServerState, prepared: Any, version: int) -> None:
        """Update one server to `version`; raise on failure."""
        ...

    def done(self, version: int) -> None:
        """Every server has been tried for `version` (clean up)."""
        ...


class TensorsOverHttp:
    """The weights as one safetensors body to `rlfactory serve`."""

    name = "tensors"

    def __init__(self, generator: ServerGenerator, timeout_s: float = 600.0) -> None:
        self.generator, self.timeout_s = generator, timeout_s

    async def prepare(self, policy: nn.Module, version: int) -> bytes:
        from safetensors.torch import save

        tensors = policy_tensors(policy)
        return await asyncio.to_thread(save, tensors, {"policy_version": str(version)})

    async def send(self, server: ServerState, prepared: bytes, version: int) -> None:
        r = await self.generator.client.post(
            f"{server.url}/update_weights_from_tensors", params={"policy_version": str(version)}, content=prepared,
            headers={"content-type": "application/octet-stream"}, timeout=self.timeout_s)
        _check_answer(r, version)

    def done(self, version: int) -> None:
        pass


class CheckpointOnDisk:
    """The weights as a checkpoint folder `sync_dir/policy_vNNNNNN`, loaded by each server through
    `/update_weights_from_disk`; older folders are removed once every server has been updated."""

    name = "disk"

    def __init__(self, generator: ServerGenerator, sync_dir: str | Path, timeout_s: float = 600.0) -> None:
        self.generator, self.timeout_s = generator, timeout_s
        self.sync_dir = Path(sync_dir).resolve()

    def folder(self, version: int) -> Path:
        return self.sync_dir / f"policy_v{version:06d}"

    async def prepare(self, policy: nn.Module, version: int) -> Path:
        return await asyncio.to_thread(self._write, policy_tensors(policy), config_of(policy), version)

    def _write(self, tensors: dict[str, torch.Tensor], config: Any, version: int) -> Path:
        from safetensors.torch import save_file

        final = self.folder(version)
        tmp = self.sync_dir / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "policy_version": str(version)})
        if config is not None and hasattr(config, "to_dict"):
            (tmp / "config.json").write_text(json.dumps(config.to_dict(), indent=1, default=str))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)  # a server never sees a half-written folder
        return final

    async def send(self, server: ServerState, prepared: Path, version: int) -> None:
        r = await self.generator.client.post(
            f"{server.url}/update_weights_from_disk", timeout=self.timeout_s,
            json={"model_path": str(prepared), "load_format": None, "abort_all_requests": False,
                  "weight_version": str(version)})
        _check_answer(r, version)

    def done(self, version: int) -> None:
        keep = self.folder(version).name
        for old in self.sync_dir.glob("policy_v*"):
            if old.name != keep:
                shutil.rmtree(old, ignore_errors=True)


def _check_answer(r: Any, version: int) -> None:
    try:
        body = r.json()
    except ValueError:
        body = None
    if r.status_code != 200 or not isinstance(body, dict) or body.get("success") is False:
        message = body.get("message") if isinstance(body, dict) else r.text[:300]
        raise RuntimeError(f"HTTP {r.status_code}: {message}")
    held = body.get("policy_version")
    if held is not None and int(held) != version:
        raise RuntimeError(f"the server reports version {held} after an update to {version}")


class ServerWeightSync:
    """Pushes the learner's weights to every server of `generator` (see the module doc); a
    `rlfactory.protocols.WeightSync`."""

    def __init__(self, generator: ServerGenerator, method: str = "auto", sync_dir: str | Path | None = None,
                 nccl: SyncMethod | None = None) -> None:
        if method in ("disk", "auto") and sync_dir is None and generator.api == "sglang":
            raise ValueError("weight sync through disk needs a folder every server can read (generator.sync_dir)")
        self.generator = generator
        self.method = method
        self._methods: dict[str, SyncMethod] = {"tensors": TensorsOverHttp(generator)}
        if sync_dir is not None:
            self._methods["disk"] = CheckpointOnDisk(generator, sync_dir)
        self._nccl = nccl
        self.pushed: int | None = None
        """The last version pushed (to at least one server) in this process."""
        self.history: list[dict[str, float]] = []

    @property
    def versions(self) -> dict[str, int | None]:
        """The version each server holds (None: its last sync failed)."""
        return {s.url: None if s.stale else s.version for s in self.generator.servers}

    async def ensure(self, policy: nn.Module, version: int) -> dict[str, float]:
        """Push `version` unless every server already got it from this process."""
        if self.pushed == version and all(v == version for v in self.versions.values()):
            return {}
        return await self.push(policy, version)

    async def push(self, policy: nn.Module, version: int) -> dict[str, float]:
        """Send `policy`'s weights as `version` to every server; returns metrics."""
        t0 = time.perf_counter()
        for server in self.generator.servers:
            if server.kind is None:
                await self.generator.probe(server)
        # A server that does not answer at all cannot be updated (auto could not even pick a method).
        plan = [(s, self._method_for(s) if s.kind is not None or self.method != "auto" else None)
                for s in self.generator.servers]
        methods = {m.name: m for _, m in plan if m is not None}
        prepared = {name: await m.prepare(policy, version) for name, m in methods.items()}
        t_prep = time.perf_counter() - t0
        results = await asyncio.gather(*(self._one(s, m, prepared[m.name] if m else None, version) for s, m in plan))
        for method in methods.values():
            method.done(version)
        self.pushed = version
        size = sum(p.numel() * p.element_size() for n, p in policy.named_parameters() if "lora_" not in n) / 1e6
        metrics = {WEIGHT_SYNC_SECONDS: time.perf_counter() - t0, WEIGHT_SYNC_PREPARE_S: t_prep,
                   WEIGHT_SYNC_MB: size, WEIGHT_SYNC_OK: float(sum(results)),
                   WEIGHT_SYNC_FAILED: float(len(results) - sum(results))}
        self.history.append(metrics)
        return metrics

    def _method_for(self, server: ServerState) -> SyncMethod:
        name = self.method
        if name == "auto":
            if server.kind == "rlfactory":
                # On this machine a checkpoint folder goes through the page cache, several times
                # faster than the same bytes through an HTTP body (benchmarks/weight_sync.py).
                name = "disk" if _is_loopback(server.url) and "disk" in self._methods else "tensors"
            else:
                name = "disk" if self.generator.api == "sglang" else "nccl"
        if name == "nccl":
            if self._nccl is None:
                from rlfactory.train.weight_sync_vllm import VllmNccl

                self._nccl = VllmNccl(self.generator)
            return self._nccl
        if name not in self._methods:
            raise ValueError(f"generator.weight_sync {name!r} needs generator.sync_dir")
        return self._methods[name]

    async def _one(self, server: ServerState, method: SyncMethod | None, prepared: Any, version: int) -> bool:
        await self.generator.hold(server)
        ok = False
        try:
            if method is None:
                raise ConnectionError("unreachable (no answer on /health)")
            await method.send(server, prepared, version)
            ok = True
        except Exception as e:  # one server failing must not stop the run; it gets no turns until fixed
            name = method.name if method is not None else self.method
            print(f"rlfactory: weight sync ({name}) to {server.url} failed: {type(e).__name__}: {e}; "
                  "it gets no turns until a later sync succeeds", file=sys.stderr)
        finally:
            self.generator.release(server, version if ok else None)
        return ok


def _is_loopback(url: str) -> bool:
    import ipaddress
    from urllib.parse import urlparse

    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_weight_sync(cfg: RunConfig, generator: Generator) -> ServerWeightSync | None:
    """The ServerWeightSync for a run config, or None when generation is local (or weight_sync: none)."""
    gen_cfg = cfg.generator
    if not isinstance(generator, ServerGenerator) or gen_cfg.weight_sync == "none":
        return None
    sync_dir = gen_cfg.sync_dir or str(Path(cfg.trainer.run_dir) / "weight_sync")
    return ServerWeightSync(generator, gen_cfg.weight_sync, sync_dir)
