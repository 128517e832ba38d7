"""Joining or starting the Ray cluster a `trainer.backend: ray` run uses."""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, TypeVar

from rlfactory.config import RayConfig

if TYPE_CHECKING:
    from ray.actor import ActorHandle

A = TypeVar("A")  # the class an actor runs (ToolPool, RolloutWorker)


def require_ray() -> ModuleType:
    """The `ray` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("trainer.backend: ray needs the `ray` package: pip install 'rlfactory[ray]'") from e
    return ray


def connect_cluster(cfg: RayConfig) -> bool:
    """Make this process a Ray driver. Returns True when it connected here (and must call
    `ray.shutdown()` when done), False when Ray was already initialised by the caller.

    Order: `ray.address` from the config; else `ray.init(address="auto")` when RAY_ADDRESS is
    set (an existing cluster); else a new local cluster with `ray.num_cpus` (default: this
    machine's cores) and `ray.temp_dir`.
    """
    ray = require_ray()
    if ray.is_initialized():
        return False
    if cfg.address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=cfg.address or "auto", log_to_driver=True)
    else:
        ray.init(num_cpus=cfg.num_cpus or os.cpu_count() or 1, _temp_dir=str(cfg.temp_dir) if cfg.temp_dir else None,
                 include_dashboard=False, log_to_driver=True)
    return True


def actor_died_errors() -> tuple[type[BaseException], ...]:
    """The exceptions Ray raises for a call to an actor whose process is gone or unreachable."""
    from ray.exceptions import ActorUnavailableError, RayActorError

    return (RayActorError, ActorUnavailableError)


async def end_actors(actors: Sequence[ActorHandle[A]], timeout_s: float = 30.0) -> None:
    """End each actor (`ray.kill`, no restart) and wait, up to timeout_s, until Ray reports it
    dead, so that its process is gone before the caller goes on (or disconnects)."""
    import asyncio
    import time

    import ray

    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already gone
            pass
    deadline = time.monotonic() + timeout_s

    async def dead(actor: ActorHandle[A]) -> None:
        while time.monotonic() < deadline:
            try:
                await asyncio.wait_for(actor.__ray_ready__.remote(), max(0.1, deadline - time.monotonic()))
            except actor_died_errors():
                return
            except Exception:  # timed out, or any other answer than "dead": give up waiting
                return
            await asyncio.sleep(0.05)

    await asyncio.gather(*(dead(a) for a in actors))
