"""Checkpoints: Hugging Face weights plus everything needed to continue the run exactly.

Layout of `run_dir/checkpoints/step_000010/`:
    model/            `save_pretrained` of the policy (full weights, or the LoRA adapter) and tokenizer
    trainer_state.pt  optimizer, scheduler, critic, RNG states (python, numpy, torch, cuda)
    meta.json         step, policy version, data position, seed; written last
The FSDP learner (rlfactory.distributed.fsdp) writes the same model/ folder (rank 0, from the
gathered full state dict) and meta.json, keeps the optimizer out of trainer_state.pt and writes it
sharded to optimizer/ (torch.distributed.checkpoint: one file per rank plus .metadata), and each
rank's RNG states to rng_rank<r>.pt.

A checkpoint is built in a temporary folder, every file is fsynced, and the folder is renamed
into place (then the parent is fsynced): a crash leaves either the whole checkpoint or none.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

_STEP_DIR = re.compile(r"^step_(\d+)$")
TMP_PREFIX = ".tmp-"


@dataclass
class CheckpointMeta:
    step: int
    """Training steps completed."""
    policy_version: int
    data_position: int
    """Dataset rows consumed so far (the prompt sampler's position)."""
    seed: int
    lora: bool = False
    world_size: int = 1
    """Processes that trained it; > 1 (or an FSDP run of 1): optimizer state in optimizer/ (sharded)."""
    sharded: bool = False
    """Written by the FSDP learner: optimizer state under optimizer/ (torch.distributed.checkpoint)."""


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (those with meta.json), oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / "meta.json").is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def save_checkpoint(
    run_dir: str | Path,
    meta: CheckpointMeta,
    model: Any,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    keep_last: int,
) -> Path:
    """Write checkpoint `meta.step` atomically and delete all but the newest `keep_last`."""
    tmp, final = start_checkpoint(run_dir, meta.step, suffix=f"-{os.getpid()}")
    write_checkpoint_files(tmp, meta, model, tokenizer, {**trainer_state, "rng": rng_state()})
    commit_checkpoint(run_dir, tmp, final, keep_last)
    return final


def start_checkpoint(run_dir: str | Path, step: int, suffix: str = "") -> tuple[Path, Path]:
    """An empty temporary folder for checkpoint `step`, and the final path it will be renamed to."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f"{TMP_PREFIX}step_{step:06d}{suffix}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp, final


def write_checkpoint_files(tmp: Path, meta: CheckpointMeta, model: Any, tokenizer: Any,
                           trainer_state: dict[str, Any], state_dict: dict[str, Any] | None = None) -> None:
    """model/ (`save_pretrained`, of `state_dict` when given), trainer_state.pt and meta.json."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keep stderr for the trainer's own progress bar
    extra = {"state_dict": state_dict} if state_dict is not None else {}
    model.save_pretrained(tmp / "model", safe_serialization=True, **extra)
    if tokenizer is not None:
        from rlfactory.chat.qwen_vl import save_image_processor

        tokenizer.save_pretrained(tmp / "model")
        save_image_processor(tokenizer, tmp / "model")  # a vision-language model's pixels need it
    torch.save(trainer_state, tmp / "trainer_state.pt")
    (tmp / "meta.json").write_text(json.dumps(asdict(meta), indent=1), encoding="utf-8")


def commit_checkpoint(run_dir: str | Path, tmp: Path, final: Path, keep_last: int) -> None:
    """fsync the temporary folder, rename it to `final` (replacing an older attempt), prune."""
    _fsync_tree(tmp)
    if final.exists():  # a checkpoint of the same step from an earlier, interrupted attempt
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    prune_checkpoints(run_dir, keep_last)


def prune_checkpoints(run_dir: str | Path, keep_last: int) -> None:
    """Delete complete checkpoints beyond the newest `keep_last`, and leftover temporary folders."""
    root = checkpoint_dir(run_dir)
    for _, p in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(p, ignore_errors=True)


def read_meta(path: str | Path) -> CheckpointMeta:
    """meta.json of checkpoint folder `path`."""
    return CheckpointMeta(**json.loads((Path(path) / "meta.json").read_text(encoding="utf-8")))


def load_checkpoint(path: str | Path) -> tuple[CheckpointMeta, dict[str, Any]]:
    """(meta, trainer_state) of checkpoint folder `path`; the weights are in `path/model`."""
    path = Path(path)
    meta = read_meta(path)
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    return meta, state
