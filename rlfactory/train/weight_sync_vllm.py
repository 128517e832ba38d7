"""Weight sync to vLLM servers through vLLM's weight-transfer routes with an NCCL broadcast.

The sequence follows vLLM's documented example examples/rl/rlhf_http_nccl.py (vllm-project/vllm
at 27cb2fe857042f119985e616b0965af7f9199d3d) and its routes in
vllm/entrypoints/serve/dev/rlhf/api_router.py. The server runs with
`VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{"backend": "nccl"}'`.

Once per server: `GET /get_world_size`; then `POST /init_weight_transfer_engine` with
`{"init_info": {master_address, master_port, rank_offset: 1, world_size}}` while the trainer joins
the same NCCL group as rank 0 (`NCCLWeightTransferEngine.trainer_init`).
Per update: `POST /pause?mode=wait` (turns in flight finish on the old weights),
`POST /start_weight_update {"is_checkpoint_format": true}`, `POST /update_weights` with
`{"update_info": {names, dtype_names, shapes, packed: true}}` while the trainer broadcasts the
tensors (`NCCLWeightTransferEngine.trainer_send_weights`), `POST /finish_weight_update
{"weight_version": "N"}`, `POST /resume`. vLLM's answers carry no version; the ServerGenerator
records the version of each server after the update (its gate keeps turns out meanwhile).

This needs GPUs and vLLM on the trainer side; it cannot run where rlfactory's CI runs. The HTTP
sequence is tested against a recording server with the NCCL part replaced (tests/train).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Protocol
from urllib.parse import urlparse

from torch import nn

from rlfactory.generation.server_generator import ServerGenerator, ServerState
from rlfactory.train.policy_weights import policy_tensors


class NcclTransport(Protocol):
    def join(self, master_address: str, master_port: int, world_size: int) -> Any:
        """Join the NCCL group as rank 0; returns the group handle (blocks until all ranks joined)."""
        ...

    def send(self, group: Any, named_tensors: list[tuple[str, Any]]) -> None:
        """Broadcast the tensors (on the GPU) to the group."""
        ...


class VllmNcclTransport:
    """The real transport: vLLM's trainer-side NCCL engine (needs vLLM and CUDA here)."""

    def join(self, master_address: str, master_port: int, world_size: int) -> Any:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        return NCCLWeightTransferEngine.trainer_init(
            dict(master_address=master_address, master_port=master_port, world_size=world_size))

    def send(self, group: Any, named_tensors: list[tuple[str, Any]]) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerSendWeightsArgs, NCCLWeightTransferEngine

        NCCLWeightTransferEngine.trainer_send_weights(
            iterator=iter(named_tensors), trainer_args=NCCLTrainerSendWeightsArgs(group=group, packed=True))


def _local_address_towards(url: str) -> str:
    """This machine's address on the route to `url` (what the server dials for NCCL)."""
    host = urlparse(url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class VllmNccl:
    """SyncMethod for vLLM servers (see the module doc)."""

    name = "nccl"

    def __init__(self, generator: ServerGenerator, transport: NcclTransport | None = None, timeout_s: float = 600.0) -> None:
        self.generator = generator
        self.transport = transport or VllmNcclTransport()
        self.timeout_s = timeout_s
        self._groups: dict[str, Any] = {}

    async def prepare(self, policy: nn.Module, version: int) -> list[tuple[str, Any]]:
        return list(policy_tensors(policy, cpu=False).items())

    async def send(self, server: ServerState, prepared: list[tuple[str, Any]], version: int) -> None:
        if server.url not in self._groups:
            self._groups[server.url] = await self._init(server)
        group = self._groups[server.url]
        await self._post(server, "/pause", params={"mode": "wait"})
        try:
            await self._post(server, "/start_weight_update", json={"is_checkpoint_format": True})
            info = {"names": [n for n, _ in prepared], "dtype_names": [str(t.dtype).split(".")[-1] for _, t in prepared],
                    "shapes": [list(t.shape) for _, t in prepared], "packed": True}
            await asyncio.gather(self._post(server, "/update_weights", json={"update_info": info}),
                                 asyncio.to_thread(self.transport.send, group, prepared))
            await self._post(server, "/finish_weight_update", json={"weight_version": str(version)})
        finally:
            await self._post(server, "/resume")

    def done(self, version: int) -> None:
        pass

    async def _init(self, server: ServerState) -> Any:
        r = await self.generator.client.get(server.url + "/get_world_size", timeout=self.timeout_s)
        r.raise_for_status()
        world_size = int(r.json()["world_size"]) + 1  # + the trainer
        address, port = _local_address_towards(server.url), _free_port()
        init = {"init_info": {"master_address": address, "master_port": port, "rank_offset": 1, "world_size": world_size}}
        _, group = await asyncio.gather(self._post(server, "/init_weight_transfer_engine", json=init),
                                        asyncio.to_thread(self.transport.join, address, port, world_size))
        return group

    async def _post(self, server: ServerState, path: str, **kwargs: Any) -> Any:
        r = await self.generator.client.post(server.url + path, timeout=self.timeout_s, **kwargs)
        if r.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {r.status_code}: {r.text[:300]}")
        return r
