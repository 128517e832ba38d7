"""ServedModel: a LocalGenerator with a policy version and weight updates that never split a turn.

Versions. A weight update closes the gate (new turns wait), waits until every turn in flight has
finished, copies the new weights, bumps the version, drops the kept KV caches (they were computed
by the old weights) and reopens the gate. So all tokens of a turn come from one set of weights,
and the version returned with a turn is the one that produced all of it. An update that does not
fit the model (names, shapes) is refused before anything is copied.

Sessions. A turn that names a session keeps that trajectory's KV cache for its next turn (see
LocalGenerator); at most `max_sessions` are kept, the least recently used is dropped first, and a
client releases one with `release`.

Images. A vision-language model is served with its family's image processor (`pixel_source`):
a turn's images go through the local generator's vision prefill, each encoded once while its
trajectory's cache is kept, with the same pixels the client's trainer computes from the same
model folder. A request whose images do not match its image pads is refused alone.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Callable

import torch

from rlfactory.chat.registry import make_tool_manager
from rlfactory.chat.vision import PixelSource
from rlfactory.protocols import GenRequest, GenResult
from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.vision import vision_body
from rlfactory.generation.versioned import VersionedGenerator
from rlfactory.generation.weights import load_safetensors_folder, load_weights


def eos_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """The model's end-of-sequence ids (tokenizer and generation config)."""
    ids: list[int] = []
    for value in (getattr(tokenizer, "eos_token_id", None),
                  getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and int(v) not in ids:
                ids.append(int(v))
    return tuple(ids)


def pixel_source(model: Any, tokenizer: Any) -> PixelSource | None:
    """What turns images into `model`'s pixel inputs (its vision-language family's ToolManager,
    reading the image processor beside the tokenizer); None for a model that takes no pixels."""
    try:
        vision_body(model)
    except ValueError:
        return None
    manager = make_tool_manager(tokenizer, model_type=getattr(model.config, "model_type", None))
    if not isinstance(manager, PixelSource):
        raise ValueError(f"the {getattr(manager, 'family', type(manager).__name__)} ToolManager of this vision-language "
                         "model computes no pixels: set a vision-language family (qwen2_5_vl, qwen3_vl)")
    return manager


class ServedModel:
    """`model` (a transformers causal LM in eval mode) served to many requests at once."""

    def __init__(self, model: Any, tokenizer: Any, *, name: str, pad_id: int, max_batch: int = 256,
                 seed: int | None = None, max_sessions: int | None = None, version: int = 0,
                 pixels: PixelSource | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.eos_ids = eos_ids(model, tokenizer)
        device = next(model.parameters()).device
        self.generator = LocalGenerator(model, pad_id, self.eos_ids, tokenizer=tokenizer, device=device,
                                        max_batch=max_batch, seed=seed, pixels=pixels)
        self.takes_images = pixels is not None
        self.max_batch = int(max_batch)
        self.max_sessions = int(max_sessions or 4 * max_batch)
        self.context = int(getattr(getattr(model, "config", None), "max_position_embeddings", 0) or 0)
        embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        self.vocab = int(getattr(embeddings, "num_embeddings", 0) or 0)
        """Rows of the input embedding: a prompt id past them is refused (0: not checked)."""
        self.gate = VersionedGenerator(self.generator, version)
        """Turns and weight updates: new weights are taken between turns, never inside one."""
        self.updates = 0
        self.turns = 0
        self._sessions: OrderedDict[str, None] = OrderedDict()

    @property
    def version(self) -> int:
        return self.gate.version

    @property
    def active(self) -> int:
        """Turns in flight."""
        return self.gate.active

    @property
    def updates_waited(self) -> int:
        """Updates that had to wait for turns in flight to finish."""
        return self.gate.updates_waited

    async def generate(self, request: GenRequest) -> tuple[GenResult, int]:
        """One turn; returns it with the policy version that produced all of its tokens."""
        result = await self.gate.submit(request)
        self.turns += 1
        if request.session is not None:
            self._keep(request.session)
        return result, result.policy_version

    def release(self, session: str) -> bool:
        """Drop the KV cache kept for `session`; False when none was kept."""
        known = session in self._sessions
        self._sessions.pop(session, None)
        self.generator.forget(session)
        return known

    async def update_from_tensors(self, tensors: dict[str, torch.Tensor], version: int | None) -> int:
        """Load `tensors` (name -> tensor); returns the new policy version."""
        return await self._update(lambda: load_weights(self.model, tensors, "the served model"), version)

    async def update_from_disk(self, folder: str, version: int | None) -> int:
        """Load the safetensors weights of checkpoint folder `folder`; returns the new version."""
        return await self._update(lambda: load_weights(self.model, load_safetensors_folder(folder), "the served model"), version)

    async def _update(self, apply: Callable[[], int], version: int | None) -> int:
        await self.gate.update(apply, version)  # turns in flight finish on the old weights; kept caches dropped
        self.updates += 1
        self._sessions.clear()
        return self.version

    def _keep(self, session: str) -> None:
        self._sessions[session] = None
        self._sessions.move_to_end(session)
        while len(self._sessions) > self.max_sessions:
            old, _ = self._sessions.popitem(last=False)
            self.generator.forget(old)

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "server": "rlfactory", "model": self.name, "policy_version": self.version,
                "weight_version": str(self.version), "max_batch": self.max_batch, "active": self.active, "turns": self.turns,
                "kept_sessions": self.generator.kept_sessions, "updates": self.updates,
                "updates_waited": self.updates_waited, "images": self.takes_images, "time": time.time()}

    def close(self) -> None:
        self.generator.close()
