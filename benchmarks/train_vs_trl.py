"""rlfactory's GRPO step vs TRL 1.16 `GRPOTrainer`, measured in one run on the same model.

Two scenarios, both on rlfactory's tiny:10m model (Qwen3 architecture), same prompts, group
size, token limits, sampling temperature, learning rate, no KL/reference model, fp32, and one
optimizer step per generation batch (TRL: steps_per_generation=1, num_iterations=1, gradient
checkpointing off; rlfactory: algo.epochs=1, one minibatch):

1. tools: a `lookup` tool served over MCP (stdio) that takes --latency seconds (0.2). The model
   is first warm-started (plain next-token SFT, here, deterministic, cached in benchmarks/.cache)
   to answer with `--calls` lookups and then `<answer>`, so both trainers run the same
   multi-turn episodes (the tool calls per step are printed for both). TRL uses its built-in tool
   loop (`GRPOTrainer(tools=[...])`) with an async tool that calls the same MCP server through
   the same client (rlfactory's ToolRunner); rlfactory rolls out with its async engine.
   Figure: step time (ratio = TRL / rlfactory; target >= 4x).
2. no tools: the untrained tiny:10m, same prompts, one turn, completions run to the token limit
   in both. Figure: training tokens/s = (prompt + model-sampled tokens of the step, TRL's
   `num_tokens`) / training time, where training time = step time minus rollout and scoring
   (TRL: minus `_generate_and_score_completions`; rlfactory: its `time/train_s`): the update's
   throughput (ratio = rlfactory / TRL; target >= 1.5x). Whole-step tokens/s is printed too.
   Where the gain comes from: rlfactory's update runs each distinct prompt once per group and
   lets the group's completions attend to it (rlfactory/train/batch.py), TRL runs the prompt
   again with every completion. So the figure is printed beside the rate per *computed* token
   (distinct prompt tokens once, plus the completions; for TRL every token it runs): that rate
   says how fast the forward/backward itself is, the training-tokens rate what the sharing saves.

Each framework runs in its own subprocess; the four workers run one after another, in
--rounds interleaved rounds, and the figures are medians over all steps but the first of each
run (warm-up). The machine may be shared: the load average during each worker is printed.

    .venv/bin/python benchmarks/train_vs_trl.py [--rounds 2] [--steps 3] [--prompts 4] [--group 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORDS = ["apple", "river", "candle", "forest", "marble", "window", "garden", "silver"]
SYSTEM = "Find the code. Use the lookup tool: it may point to another key. Answer as <answer>code</answer>."
KEYS = ["code", "key", "value"]
WARM_VERSION = 1  # bump when the episode or the warm-start recipe changes  # the chain of lookups an episode makes: code -> key -> value


def tool_text(query: str, calls: int) -> str:
    """What `lookup` returns: stateless and the same for every question, so that a short
    warm-start can teach the whole episode (lookup `code`, then `key`, ..., then answer)."""
    q = query.strip().lower()
    i = KEYS.index(q) if q in KEYS else len(KEYS)
    return f"{q} -> see {KEYS[i + 1]}" if i + 1 < min(calls, len(KEYS)) else f"{q} -> 42"


def rows() -> list[dict]:
    """The prompts (both scenarios, both frameworks)."""
    return [{"id": f"q{i}", "word": w, "messages": [{"role": "system", "content": SYSTEM},
                                                    {"role": "user", "content": f"What is the code of {w}?"}]}
            for i, w in enumerate(WORDS)]


def answered(trajectory) -> float:
    """rlfactory reward term: the model gave an <answer>."""
    return float("<answer>" in trajectory.model_text())


# ---- the MCP tool server ------------------------------------------------------------------


def serve_tool(latency: float, calls: int) -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("slow", log_level="WARNING")

    @server.tool()
    async def lookup(query: str) -> str:
        """Look up a word in the code book."""
        await asyncio.sleep(latency)  # a slow service: calls overlap when the client sends them together
        return tool_text(query, calls)

    server.run("stdio")


def mcp_config(latency: float, calls: int) -> dict:
    args = [str(Path(__file__)), "--serve-tool", "--latency", str(latency), "--calls", str(calls)]
    return {"mcpServers": {"slow": {"command": sys.executable, "args": args}}}


# ---- warm start ---------------------------------------------------------------------------


def episode(calls: int) -> list[dict]:
    """The assistant/tool turns of an episode with `calls` lookups, then the answer."""
    turns = []
    for q in KEYS[:calls]:
        turns.append({"role": "assistant", "content": "",
                      "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"query": q}}}]})
        turns.append({"role": "tool", "name": "lookup", "content": tool_text(q, calls)})
    turns.append({"role": "assistant", "content": "<answer>42</answer>"})
    return turns


def trl_lookup_schema() -> dict:
    from transformers.utils import get_json_schema

    return get_json_schema(_lookup_signature)


def _lookup_signature(query: str) -> str:
    """Look up a word in the code book.

    Args:
        query: The word to look up.
    """
    return query


def warm_start(out: Path, calls: int, latency: float, steps: int, lr: float = 3e-3) -> None:
    """Next-token SFT of tiny:10m on the episode, rendered with both tool schemas (TRL's from the
    Python signature, rlfactory's from the MCP server), 4 sequences per step."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlfactory.tiny import resolve_model
    from rlfactory.tools import ToolRunner
    from rlfactory.config import ToolsConfig

    base = resolve_model("tiny:10m")
    tok = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)

    async def mcp_schema() -> dict:
        async with ToolRunner.from_config(ToolsConfig(mcp=mcp_config(latency, calls))) as runner:
            return runner.specs()[0].openai_schema()

    schemas = [trl_lookup_schema(), asyncio.run(mcp_schema())]
    examples = []  # (ids, number of prompt tokens): the loss is on what follows the prompt
    for r in rows():
        for schema in schemas:
            prompt = tok.apply_chat_template(r["messages"], tools=[schema], tokenize=False, add_generation_prompt=True)
            full = tok.apply_chat_template(r["messages"] + episode(calls), tools=[schema], tokenize=False)
            assert full.startswith(prompt)
            examples.append((tok(full).input_ids, len(tok(prompt).input_ids)))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    # 10 steps of warm-up, then cosine decay to 0: the last steps settle the memorised episode
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda n: min(1.0, (n + 1) / 10) * 0.5 * (1 + math.cos(math.pi * min(n, steps) / steps)))
    model.train()
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        pick = [examples[i] for i in torch.randperm(len(examples), generator=g)[:2].tolist()]
        width = max(len(ids) for ids, _ in pick)
        input_ids = torch.full((len(pick), width), tok.pad_token_id)
        labels = torch.full((len(pick), width), -100)
        mask = torch.zeros((len(pick), width), dtype=torch.long)
        for i, (ids, plen) in enumerate(pick):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            mask[i, : len(ids)] = 1
            labels[i, plen : len(ids)] = torch.tensor(ids[plen:])
        enc = argparse.Namespace(input_ids=input_ids, attention_mask=mask)
        loss = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 5 == 0 or step == steps - 1:
            print(f"  warm-start step {step}: loss {loss.item():.4f}", file=sys.stderr, flush=True)
    print(f"warm-start: {steps} steps, final loss {loss.item():.4f}", file=sys.stderr)
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)


# ---- rlfactory ----------------------------------------------------------------------------


def run_rlfactory(model_dir: str, tools: bool, a: argparse.Namespace, work: Path) -> dict:
    from rlfactory.config import validate
    from rlfactory.trajectory import read_jsonl
    from rlfactory.config import RunConfig
    from rlfactory.train.run import train

    data = work / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    run_dir = work / ("rlf-tools" if tools else "rlf-notools")
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = validate(RunConfig, {
        "model": {"path": model_dir, "family": "qwen3"},
        "tools": {"mcp": mcp_config(a.latency, a.calls) if tools else None},
        "env": {"name": "rlfactory.rollout.prompt_env:PromptEnv", "train_data": str(data)},
        "reward": {"terms": {"train_vs_trl:answered": 1.0}},
        "sampling": {"temperature": a.temperature},
        "rollout": {"mode": "async", "max_turns": a.calls + 1 if tools else 1, "max_new_tokens": a.max_completion,
                    "max_total_tokens": 4096, "max_observation_tokens": 64},
        "algo": {"group_size": a.group, "advantage": "grpo", "loss": "ppo", "epochs": 1},
        "trainer": {"steps": a.steps, "prompts_per_step": a.prompts, "lr": 1e-5, "seed": 0, "run_dir": str(run_dir),
                    "save_every": 0, "progress": False, "max_grad_norm": 1.0},
    })
    history = asyncio.run(train(cfg))
    steps = []
    for i, m in enumerate(history, start=1):
        trajs = read_jsonl(run_dir / "trajectories" / f"step_{i:06d}.jsonl")
        tokens = sum(t.prompt_len + sum(t.loss_mask) for t in trajs)
        # The training forward runs each distinct prompt once (and every token after it).
        prompts = {tuple(t.input_ids[: t.prompt_len]) for t in trajs}
        computed = sum(len(p) for p in prompts) + sum(len(t.input_ids) - t.prompt_len for t in trajs)
        calls = sum(1 for t in trajs for c in t.tool_calls if c.status == "ok")  # executed, as TRL counts
        steps.append({"time_s": m["time/step_s"], "train_s": m["time/train_s"], "tokens": tokens, "tool_calls": calls,
                      "computed_tokens": computed,
                      "completion_tokens": sum(sum(t.loss_mask) for t in trajs) / len(trajs)})
    return {"steps": steps}


# ---- TRL ----------------------------------------------------------------------------------


def run_trl(model_dir: str, tools: bool, a: argparse.Namespace, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    import trl
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import add_response_schema

    from rlfactory.tools import ToolRunner
    from rlfactory.tools.base import ToolCall
    from rlfactory.config import ToolsConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    # rlfactory's tiny template is Qwen3's; TRL recognises Qwen3 by its own copy of the template
    # (identical rendering for string contents), which gives it the response parser and the
    # prefix-preserving training template it needs for tools.
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    if tools:
        tok = add_response_schema(tok)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    n = a.prompts * a.group
    ds = Dataset.from_list([{"prompt": r["messages"]} for r in rows()] * (a.steps * a.prompts))

    state: dict = {}

    async def lookup(query: str) -> str:
        """Look up a word in the code book.

        Args:
            query: The word to look up.
        """
        if "runner" not in state:  # opened on TRL's tool event loop, where the calls run
            state["runner"] = ToolRunner.from_config(ToolsConfig(mcp=mcp_config(a.latency, a.calls)))
            await state["runner"].start()
        (res,) = await state["runner"].run([ToolCall("lookup", {"query": query})])
        return res.text

    def reward(completions, **_):
        return [float("<answer>" in "".join(m.get("content") or "" for m in c if m["role"] == "assistant"))
                for c in completions]

    class Timer(TrainerCallback):
        """Step wall time, and within it the time of rollout + scoring (the rest is training)."""

        def __init__(self):
            self.steps, self.t0, self.gen_s, self.last_tokens = [], 0.0, 0.0, 0

        def on_step_begin(self, args, st, control, **kw):
            self.t0, self.gen_s = time.perf_counter(), 0.0

        def on_step_end(self, args, st, control, **kw):
            total = time.perf_counter() - self.t0
            self.steps.append({"time_s": total, "train_s": total - self.gen_s})

        def on_log(self, args, st, control, logs=None, **kw):
            if logs and "num_tokens" in logs and self.steps:
                self.steps[-1]["tokens"] = logs["num_tokens"] - self.last_tokens
                self.steps[-1]["computed_tokens"] = self.steps[-1]["tokens"]  # every sequence runs whole
                self.last_tokens = logs["num_tokens"]
                self.steps[-1]["tool_calls"] = logs.get("tools/call_frequency", 0.0) * n
                self.steps[-1]["completion_tokens"] = logs.get("completions/mean_length", 0.0)

    cfg = GRPOConfig(
        output_dir=str(work / ("trl-tools" if tools else "trl-notools")), per_device_train_batch_size=n,
        num_generations=a.group, gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        max_steps=a.steps, learning_rate=1e-5, beta=0.0, temperature=a.temperature, max_completion_length=a.max_completion
        if not tools else a.max_completion * (a.calls + 1), max_tool_calling_iterations=a.calls if tools else None,
        use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no", seed=0,
        dataloader_num_workers=0, max_grad_norm=1.0, disable_tqdm=True, lr_scheduler_type="constant",
        gradient_checkpointing=False,  # TRL's default is on; off is faster here and matches rlfactory
    )
    timer = Timer()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=ds, processing_class=tok,
                          tools=[lookup] if tools else None, callbacks=[timer])
    generate = trainer._generate_and_score_completions

    def timed_generate(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            timer.gen_s += time.perf_counter() - t0

    trainer._generate_and_score_completions = timed_generate
    trainer.train()
    return {"steps": timer.steps}


# ---- orchestration ------------------------------------------------------------------------


def worker(a: argparse.Namespace) -> None:
    work = Path(a.work)
    fn = run_rlfactory if a.worker.startswith("rlfactory") else run_trl
    result = fn(a.model, a.worker.endswith("-tools"), a, work)
    Path(a.out).write_text(json.dumps(result))


def _spawn(kind: str, model: str, a: argparse.Namespace, work: Path) -> dict:
    out = work / f"{kind}.json"
    cmd = [sys.executable, str(Path(__file__)), "--worker", kind, "--model", model, "--work", str(work), "--out", str(out),
           "--steps", str(a.steps), "--prompts", str(a.prompts), "--group", str(a.group), "--latency", str(a.latency),
           "--calls", str(a.calls), "--max-completion", str(a.max_completion), "--temperature", str(a.temperature)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise SystemExit(f"{kind} failed (exit {proc.returncode})")
    result = json.loads(out.read_text())
    result["load"] = (load0 + os.getloadavg()[0]) / 2
    print(f"  {kind}: done in {time.perf_counter() - t0:.0f}s (load average ~{result['load']:.1f})", file=sys.stderr)
    return result


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _stats(runs: list[dict]) -> dict:
    """Medians over the steps of all runs of one worker, each run's first step (warm-up) left out."""
    steps = [st for r in runs for st in (r["steps"][1:] if len(r["steps"]) > 1 else r["steps"])]
    return {
        "time_s": _median([st["time_s"] for st in steps]),
        "tokens": _median([st.get("tokens", 0.0) for st in steps]),
        "tokens_per_s": _median([st.get("tokens", 0.0) / st["time_s"] for st in steps]),
        "train_s": _median([st["train_s"] for st in steps]),
        "train_tokens_per_s": _median([st.get("tokens", 0.0) / st["train_s"] for st in steps]),
        "computed_tokens_per_s": _median([st.get("computed_tokens", 0.0) / st["train_s"] for st in steps]),
        "tool_calls": _median([st.get("tool_calls", 0.0) for st in steps]),
        "completion_tokens": _median([st.get("completion_tokens", 0.0) for st in steps]),
        "steps": len(steps),
        "load": sum(r["load"] for r in runs) / len(runs),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3, help="steps per run (the first is warm-up)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each worker, interleaved (rlf, TRL, rlf, TRL ...)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--latency", type=float, default=0.2, help="seconds per tool call")
    p.add_argument("--calls", type=int, default=2, help="lookups per episode the warm-start teaches")
    p.add_argument("--max-completion", type=int, default=48, help="new tokens per model turn")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (both frameworks)")
    p.add_argument("--sft-steps", type=int, default=200)
    p.add_argument("--serve-tool", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve_tool:
        return serve_tool(a.latency, a.calls)
    if a.worker:
        return worker(a)

    import torch

    from rlfactory.tiny import resolve_model

    print(f"rlfactory vs TRL {__import__('trl').__version__} GRPO on tiny:10m, CPU ({os.cpu_count()} cores, "
          f"{torch.get_num_threads()} torch threads, shared with other jobs); {a.prompts} prompts x group {a.group} "
          f"per step; {a.rounds} interleaved runs of {a.steps} steps per worker, first step of each run left out; "
          f"medians; <= {a.max_completion} new tokens per model turn; temperature {a.temperature:g}", flush=True)
    kinds = ("rlfactory-tools", "trl-tools", "rlfactory-notools", "trl-notools")
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="rlf-bench-") as tmp:
        work = Path(tmp)
        # The warm-start is deterministic; it is kept in benchmarks/.cache (git-ignored) for reruns.
        tuned = HERE / ".cache" / f"train_vs_trl-warm-v{WARM_VERSION}-calls{a.calls}-steps{a.sft_steps}"
        if not (tuned / "model.safetensors").is_file():
            t0 = time.perf_counter()
            warm_start(tuned, a.calls, a.latency, a.sft_steps)
            print(f"  warm-start SFT: {time.perf_counter() - t0:.0f}s", file=sys.stderr)
        for _ in range(a.rounds):
            for k in kinds:
                runs[k].append(_spawn(k, str(tuned) if k.endswith("-tools") else resolve_model("tiny:10m"), a, work))
    res = {k: _stats(v) for k, v in runs.items()}

    def row(name: str, r: dict) -> str:
        return (f"  {name:<16} step {r['time_s']:6.2f}s (training {r['train_s']:5.2f}s)  tokens/step {r['tokens']:6.0f}  "
                f"step tokens/s {r['tokens_per_s']:5.0f}  training tokens/s {r['train_tokens_per_s']:5.0f} "
                f"(per computed token {r['computed_tokens_per_s']:5.0f})  "
                f"tool calls/step {r['tool_calls']:3.0f}  model tokens/traj {r['completion_tokens']:4.1f}  "
                f"({r['steps']} steps, load ~{r['load']:.1f})")

    print(f"\nwith a {a.latency:g}s MCP tool (the warm-started model makes {a.calls} calls per episode):")
    print(row("rlfactory", res["rlfactory-tools"]))
    print(row("TRL GRPOTrainer", res["trl-tools"]))
    print("\nwithout tools (untrained tiny:10m, one turn, completions to the limit):")
    print(row("rlfactory", res["rlfactory-notools"]))
    print(row("TRL GRPOTrainer", res["trl-notools"]))
    speed = res["trl-tools"]["time_s"] / res["rlfactory-tools"]["time_s"]
    thr = res["rlfactory-notools"]["train_tokens_per_s"] / res["trl-notools"]["train_tokens_per_s"]
    step_thr = res["rlfactory-notools"]["tokens_per_s"] / res["trl-notools"]["tokens_per_s"]
    per_computed = res["rlfactory-notools"]["computed_tokens_per_s"] / res["trl-notools"]["computed_tokens_per_s"]
    print()
    print(f"step time with tools, TRL / rlfactory:        {speed:5.2f}x  (target >= 4x)   {'PASS' if speed >= 4 else 'FAIL'}")
    print(f"training tokens/s without tools, rlf / TRL:   {thr:5.2f}x  (target >= 1.5x) {'PASS' if thr >= 1.5 else 'FAIL'}")
    print(f"  where it comes from: rlfactory computes each shared prompt once per group of {a.group}; per computed "
          f"token, rlf / TRL: {per_computed:.2f}x")
    print(f"(for information: whole-step tokens/s without tools, rlf / TRL: {step_thr:.2f}x)")


if __name__ == "__main__":
    main()
