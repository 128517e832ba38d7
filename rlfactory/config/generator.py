"""Config section `generator:`: where model turns are generated (in process, or on servers)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from rlfactory.config.base import ConfigPath, Section


class GeneratorConfig(Section):
    """Where generation runs. `local`: a LocalGenerator on the policy model in this process (the
    trainer updates it in place). `server`: HTTP servers speaking vLLM's completions API or SGLang's
    `/generate` (vLLM, SGLang, or `rlfactory serve`), token ids in and out; after each update the
    trainer pushes the new weights to every server (`weight_sync`)."""

    backend: Literal["local", "server"] = "local"
    """local: generate in this process; server: send each model turn to one of `urls`."""
    urls: list[str] = []
    """Base URLs of the generation servers (server backend), e.g. `http://127.0.0.1:8000`. Each
    trajectory stays on one server for all its turns; new trajectories go to the least loaded."""
    api: Literal["vllm", "sglang"] = "vllm"
    """vllm: `POST /v1/completions` with a token-id prompt and `return_token_ids`; sglang:
    `POST /generate` with `input_ids` and `return_logprob`. `rlfactory serve` speaks both."""
    served_model: str | None = None
    """vllm: the `model` field of each request (the server's `--served-model-name`); unset = sent
    empty, which vLLM takes as its only model."""
    timeout_s: float = 300.0
    """Seconds one model turn may take on a server before it counts as failed (then the turn is
    retried on another server)."""
    cooldown_s: float = 30.0
    """A server that failed or timed out gets no new requests for this many seconds."""
    weight_sync: Literal["auto", "tensors", "disk", "nccl", "none"] = "auto"
    """How the trainer sends new weights to the servers after each update. tensors: a safetensors
    body over HTTP (`rlfactory serve`); disk: a checkpoint folder under `sync_dir` named in
    `/update_weights_from_disk` (SGLang, `rlfactory serve`); nccl: vLLM's weight-transfer routes
    with an NCCL broadcast (vLLM on GPUs); none: never. auto: for `rlfactory serve` disk on a
    loopback URL (same machine, much faster) and tensors otherwise; disk for sglang; nccl for vllm."""
    sync_dir: ConfigPath | None = None
    """Folder for `weight_sync: disk`, readable by every server at the same path; unset =
    `<trainer.run_dir>/weight_sync`."""

    @model_validator(mode="after")
    def _check(self) -> "GeneratorConfig":
        if self.backend == "server" and not self.urls:
            raise ValueError("generator.urls must name at least one server when generator.backend is server")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"generator.urls: {url!r} is not an http(s) URL")
        if self.timeout_s <= 0 or self.cooldown_s < 0:
            raise ValueError("generator.timeout_s must be > 0 and generator.cooldown_s >= 0")
        return self
