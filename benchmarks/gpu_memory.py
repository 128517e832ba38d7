"""The biggest model one GPU trains: for random Qwen3 architectures (0.6B, 1.7B, 4B, 8B), whether one
full-fine-tuning GRPO step and one LoRA GRPO step fit on the GPU, with peak memory and tokens/s.

Each row builds the model on the GPU (bf16 weights, rlfactory.tiny.architectures; weights do not
change the memory or the speed), then runs two GRPO steps of rlfactory's own code path (the
LocalGenerator's rollout with CUDA graphs, then a PolicyUpdate: one epoch, one optimizer step, no
KL so no reference copy, AdamW with bf16 states; LoRA: peft adapters r=16 on every linear layer of
the decoder, the base frozen). The first step is warm-up (it allocates the optimizer state); the
second is timed. Figures:
  - peak GiB: torch.cuda.max_memory_allocated over both steps, weights included;
  - train tokens/s: trajectory tokens (prompt + completion of every sample) / update time;
  - step tokens/s: the same tokens / (rollout + update) time.
Gradient checkpointing and micro-batches as needed: a row starts at the cheapest setting an
estimate says fits (no checkpointing, the whole batch in one pass) and on CUDA out-of-memory moves
down the ladder (checkpointing, then micro-batches of 4 and 1 rows); the setting used is printed.
"Fits" is within --cap-gib of GPU memory (default 79.6 GiB, an H100 80GB's 81559 MiB): on a GPU
with more (an H200) the process is capped there, so the table says what one H100 trains.

    python benchmarks/gpu_memory.py                       # the whole table (~3 min on an H100/H200)
    python benchmarks/gpu_memory.py --models qwen3-0.6b   # one architecture
    python benchmarks/gpu_memory.py --smoke               # CPU: tiny sizes, covers the code path
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GIB = 1024 ** 3
H100_GIB = 81559 / 1024
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class Setting:
    """How a row's update runs: gradient checkpointing, and rows per pass (None: the whole batch)."""

    checkpointing: bool
    micro_batch: int | None

    def __str__(self) -> str:
        return f"ckpt {'on' if self.checkpointing else 'off'}, micro-batch {self.micro_batch or 'all'}"


LADDER = [Setting(False, None), Setting(True, None), Setting(True, 4), Setting(True, 1)]


@dataclass
class Row:
    model: str
    params_b: float
    mode: str
    fits: bool
    setting: str
    peak_gib: float | None = None
    train_tok_s: float | None = None
    step_tok_s: float | None = None
    tried: str = ""
    error: str = ""


def estimate_gib(params: float, trainable: float, layers: int, hidden: int, inter: int, tokens: int,
                 setting: Setting, rows: int) -> float:
    """A rough peak: weights (2 B/param), gradients and AdamW's two bf16 states of the trainable
    parameters (6 B/param), and activations (no checkpointing: ~(4h + 4i) bf16 values per token and
    layer; checkpointing: a layer's input per token and layer, plus one layer's full set)."""
    per_token_layer = (4 * hidden + 4 * inter) * 2
    share = tokens if setting.micro_batch is None else tokens * setting.micro_batch / rows
    acts = share * (layers * hidden * 2 + per_token_layer) if setting.checkpointing else share * layers * per_token_layer
    return (2 * params + 6 * trainable + acts) / GIB


def first_rung(estimate: Callable[[Setting], float], budget_gib: float) -> int:
    """The first setting of LADDER whose estimate is within 90% of the budget (else the last)."""
    for i, s in enumerate(LADDER):
        if estimate(s) <= 0.9 * budget_gib:
            return i
    return len(LADDER) - 1


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def run_row(arch: str, mode: str, attempt: Callable[[Setting], dict], start: int, params_b: float) -> Row:
    """Try LADDER from `start` until a setting runs; a CUDA out-of-memory moves one rung down."""
    tried = []
    for setting in LADDER[start:]:
        tried.append(str(setting))
        try:
            figures = attempt(setting)
        except Exception as e:  # noqa: BLE001 - only out-of-memory is a verdict; anything else is re-raised
            if not is_oom(e):
                raise
            print(f"  {arch} {mode}: out of memory with {setting}", file=sys.stderr, flush=True)
            continue
        return Row(arch, params_b, mode, True, str(setting), tried="; ".join(tried), **figures)
    return Row(arch, params_b, mode, False, "-", tried="; ".join(tried), error="out of memory at every setting")


def grpo_attempt(arch: str, mode: str, a: argparse.Namespace, device: torch.device, overrides: dict) -> Callable:
    """A function running two GRPO steps of `arch` in `mode` with a Setting; returns its figures."""
    from gpu_train import train_kernels  # the same kernels as the speed benchmark, resolved the same way

    kernels_seen: list = []

    def attempt(setting: Setting) -> dict:
        from rlfactory.algos.advantages import get_advantage
        from rlfactory.config import AlgoConfig, LoraSection, SamplingConfig, TrainerConfig
        from rlfactory.generation.local import LocalGenerator
        from rlfactory.protocols import GenRequest
        from rlfactory.tiny.architectures import random_model
        from rlfactory.train.batch import collate
        from rlfactory.train.model import apply_lora, make_optimizer, make_scheduler
        from rlfactory.train.update import PolicyUpdate, UpdateData
        from rlfactory.trajectory import Segment, Trajectory

        cleanup(device)
        model = policy = gen = optimizer = update = None
        try:
            model = random_model(arch, dtype=torch.bfloat16, device=device, **overrides)
            vocab = model.config.vocab_size
            if setting.checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            policy = model
            if mode == "lora":
                policy = apply_lora(model, LoraSection(r=16, alpha=32, target_modules=LORA_TARGETS))
            kernels = train_kernels(policy, device, a.kernels)
            if not kernels_seen:
                kernels_seen.append(kernels)
                print(f"  kernels ({a.kernels}): {kernels}", file=sys.stderr, flush=True)
            gen = LocalGenerator(model, pad_id=0, device=device, max_batch=a.prompts * a.group, seed=0)
            tr = TrainerConfig(lr=1e-6)
            optimizer = make_optimizer([p for p in policy.parameters() if p.requires_grad], tr)
            algo = AlgoConfig(group_size=a.group, epochs=1,
                              **({"micro_batch_size": setting.micro_batch} if setting.micro_batch else {}))
            update = PolicyUpdate(policy, optimizer, make_scheduler(optimizer, tr), algo, bf16=True,
                                  share_prefix=not setting.checkpointing, kernels=kernels)
            g = torch.Generator().manual_seed(0)
            prompts = [torch.randint(1, vocab, (a.prompt_len,), generator=g).tolist() for _ in range(a.prompts)]
            sampling = SamplingConfig(temperature=1.0)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            times = []
            for step in range(2):
                reqs = [GenRequest(p, max_new_tokens=a.completion_len, sampling=sampling, stop_token_ids=[])
                        for p in prompts for _ in range(a.group)]
                sync(device)
                t0 = time.perf_counter()
                policy.eval()
                results = asyncio.run(gen.generate(reqs))
                sync(device)
                t1 = time.perf_counter()
                trajs = [Trajectory(id=f"t{i}", group=f"g{i // a.group}", segments=[
                    Segment("prompt", list(r.prompt_ids)),
                    Segment("model", res.token_ids, logprobs=res.logprobs, policy_version=step)])
                    for i, (r, res) in enumerate(zip(reqs, results))]
                n = len(trajs)
                adv = get_advantage("grpo")(torch.rand(n, generator=g), torch.arange(n) // a.group,
                                            torch.ones(n, dtype=torch.bool))
                batch = collate(trajs, 0).to(device)
                policy.train()
                update(UpdateData(batch, adv.to(device), old_logp=None), torch.Generator().manual_seed(step))
                sync(device)
                times.append((t1 - t0, time.perf_counter() - t1))
            tokens = sum(len(r.prompt_ids) + len(res.token_ids) for r, res in zip(reqs, results))
            gen_s, train_s = times[-1]
            peak = torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None
            return {"peak_gib": peak, "train_tok_s": tokens / train_s, "step_tok_s": tokens / (gen_s + train_s)}
        finally:
            if gen is not None:
                gen.close()  # its worker thread and decode cache (and CUDA graphs) go now, not at exit
            del model, policy, gen, optimizer, update
            cleanup(device)

    return attempt


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cleanup(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def table_header(cap_gib: float) -> str:
    return (f"| model | params | mode | fits in {cap_gib:.1f} GiB | peak GiB | train tokens/s | step tokens/s | setting |\n"
            "| --- | ---: | --- | --- | ---: | ---: | ---: | --- |")


def table_line(r: Row) -> str:
    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    size = f"{r.params_b:.2f}B" if r.params_b >= 0.1 else f"{r.params_b * 1000:.2f}M"
    return (f"| {r.model} | {size} | {r.mode} | {'yes' if r.fits else 'no'} | {num(r.peak_gib, '.1f')} "
            f"| {num(r.train_tok_s, '.0f')} | {num(r.step_tok_s, '.0f')} | {r.setting} |")


def table(rows: list[Row], cap_gib: float) -> str:
    """The rows as a markdown table, smallest model first."""
    order = sorted(rows, key=lambda r: (r.params_b, r.mode))
    return "\n".join([table_header(cap_gib)] + [table_line(r) for r in order])


def main(argv: list[str] | None = None) -> list[Row]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="qwen3-8b,qwen3-4b,qwen3-1.7b,qwen3-0.6b",
                   help="largest first: under a time limit the rows that matter most come first")
    p.add_argument("--modes", default="full,lora")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=192)
    p.add_argument("--completion-len", type=int, default=64)
    p.add_argument("--kernels", choices=("auto", "off"), default="auto", help="trainer.kernels: defaults or all off")
    p.add_argument("--cap-gib", type=float, default=H100_GIB, help="GPU memory the process may use (GiB)")
    p.add_argument("--device", default=None)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (covers the code path)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())  # memory calls want an index
    overrides: dict = {}
    if a.smoke:
        a.prompts, a.group, a.prompt_len, a.completion_len = 2, 2, 8, 4
        overrides = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    from rlfactory.tiny.architectures import ARCHITECTURES

    models = a.models.split(",")
    unknown = [m for m in models if m not in ARCHITECTURES]
    if unknown:
        raise SystemExit(f"unknown --models {unknown}; known: {', '.join(ARCHITECTURES)}")
    budget = a.cap_gib
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory / GIB
        if total > a.cap_gib:
            torch.cuda.set_per_process_memory_fraction(a.cap_gib / total, device)
        budget = min(total, a.cap_gib)
        name = f"{torch.cuda.get_device_name(device)}, {total:.1f} GiB (capped at {budget:.1f} GiB)"
    else:
        name = "cpu"
    tokens = a.prompts * a.group * (a.prompt_len + a.completion_len)
    print(f"device: {device} ({name}); torch {torch.__version__}; {a.prompts} prompts x {a.group} samples, "
          f"{a.prompt_len}-token prompts, {a.completion_len} generated tokens ({tokens} trajectory tokens a step); "
          f"bf16 weights, AdamW (bf16 states), no KL; LoRA r=16 alpha=32 on {', '.join(LORA_TARGETS)}; "
          f"kernels {a.kernels}{'; smoke sizes' if a.smoke else ''}", flush=True)
    rows = []
    print(table_header(budget), flush=True)  # each row as it is measured; the whole table at the end
    for arch in models:
        spec = {**ARCHITECTURES[arch], **overrides}
        h, i, layers, vocab = spec["hidden_size"], spec["intermediate_size"], spec["num_hidden_layers"], spec["vocab_size"]
        from rlfactory.tiny.architectures import random_model

        params = sum(x.numel() for x in random_model(arch, device="meta", **overrides).parameters())
        for mode in a.modes.split(","):
            if mode not in ("full", "lora"):
                raise SystemExit(f"unknown mode {mode!r} (full, lora)")
            d_attn, d_kv = spec["num_attention_heads"] * spec["head_dim"], spec["num_key_value_heads"] * spec["head_dim"]
            lora_params = layers * 16 * (2 * (h + d_attn) + 2 * (h + d_kv) + 3 * (h + i))
            trainable = params if mode == "full" else lora_params
            head_gib = 4096 * vocab * 6 / GIB  # a fused-head chunk's logits (bf16) and their float32 gradient

            def estimate(s: Setting) -> float:
                return estimate_gib(params, trainable, layers, h, i, tokens, s, a.prompts * a.group) + head_gib

            t0 = time.perf_counter()
            row = run_row(arch, mode, grpo_attempt(arch, mode, a, device, overrides), first_rung(estimate, budget),
                          params / 1e9)
            print(f"  {arch} {mode}: {'fits' if row.fits else 'does not fit'} ({row.setting}); peak "
                  f"{row.peak_gib if row.peak_gib is None else round(row.peak_gib, 1)} GiB; "
                  f"{time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
            rows.append(row)
            print(table_line(row), flush=True)
    print()
    print(table(rows, budget))
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return rows


if __name__ == "__main__":
    main()
