"""Trials behind examples/units' settings (README "Your own task"): copy-pretraining recipes for
`tiny:1m-copy` crossed with warm-start settings, scored on the units env's seed-1 rows (never the
held-out split, which is seed 0's test rows).

Each job pretrains `tiny:1m` with a CopyRecipe (rlfactory/tiny/pretrain.py; "none": no
pretraining), then for each SFT setting fine-tunes a copy on 300 seed-1 demonstrations (the env's
solver, rendered by the chat template; loss on the assistant's turns, or on the whole text for
the first `full_text_steps`; AdamW, 10 warm-up steps, linear decay to 10%, as `rlfactory sft`)
and answers seed-1's 100 test questions greedily in two turns (the call, then the answer after
the tool text from unitconv.py, the function the server runs). Prints the share of calls with
exactly the right arguments, of right answers, and of right answers among the calls with the right
arguments (the answer-copy rate: the tool's number copied into `<answer>`), with a few failures.
Jobs run in parallel processes, on CUDA when there is one (the first sweeps' figures in
benchmarks/results/own_task.txt came from an H100).

    python benchmarks/units_copy_trials.py [JOB ...]
    python benchmarks/units_copy_trials.py [--sft N] --model FOLDER   # an already built base
    python benchmarks/units_copy_trials.py --sft 0 default             # the committed recipe, the guide's SFT

`--sft N`: only the N-th of SFTS (0: the guide's 400 steps, 100 full-text, lr 2e-3).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "units"))

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from rlfactory.tiny import resolve_model  # noqa: E402
from rlfactory.tiny.pretrain import CopyRecipe, _parse_call, pretrain_copy  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOOLS = [{"type": "function", "function": {"name": "convert", "description": "Convert an amount between units.",
          "parameters": {"properties": {"value": {"description": "The amount.", "title": "Value", "type": "number"},
                                        "from_unit": {"description": "Its unit.", "title": "From Unit", "type": "string"},
                                        "to_unit": {"description": "The unit wanted.", "title": "To Unit", "type": "string"}},
                         "required": ["value", "from_unit", "to_unit"], "type": "object", "title": "convertArguments"}}}]
SFTS = [dict(steps=400, full_text_steps=100, lr=2e-3), dict(steps=300, full_text_steps=100, lr=2e-3),
        dict(steps=300, full_text_steps=60, lr=2e-3, bs=12)]
JOBS: dict[str, dict | None] = {"none": None, "default": {}}  # default: CopyRecipe() as committed
JOBS.update({f"c{n}lr1s{s}": dict(steps=n, lr=1e-3, seed=s) for n in (900, 1200) for s in (0, 1, 2)})


def demo_items(tok, demos):
    """(token ids, loss mask on the model's turns) for each demonstration, rendered as `rlfactory sft`
    renders it (rlfactory/train/sft.py, the qwen3 family: the final answer without the empty
    `<think>` block that the chat template would put before it)."""
    from rlfactory.chat.registry import make_tool_manager
    from rlfactory.tools.base import ToolSpec
    from rlfactory.train.sft import demo_to_trajectory

    tm = make_tool_manager(tok, "qwen3")
    spec = [ToolSpec(t["function"]["name"], t["function"]["description"], t["function"]["parameters"]) for t in TOOLS]
    items = []
    for i, msgs in enumerate(demos):
        ids: list[int] = []
        mask: list[int] = []
        for seg in demo_to_trajectory(msgs, tm, spec, f"demo-{i}").segments:
            ids += list(seg.token_ids)
            mask += [int(seg.role == "model")] * len(seg.token_ids)
        items.append((ids, mask))
    return items


def sft(model, tok, items, steps, full_text_steps, lr, bs=8, seed=0):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for step in range(steps):
        f = (step + 1) / 10 if step < 10 else 1.0 - 0.9 * min(1.0, (step - 10) / max(1, steps - 10))
        for group in opt.param_groups:
            group["lr"] = lr * f
        idx = torch.randint(len(items), (bs,), generator=g).tolist()
        width = max(len(items[i][0]) for i in idx)
        ids, mask = torch.full((bs, width), tok.pad_token_id), torch.zeros(bs, width)
        for r, i in enumerate(idx):
            a, m = items[i]
            ids[r, :len(a)] = torch.tensor(a)
            mask[r, 1:len(a)] = 1.0 if step < full_text_steps else torch.tensor(m[1:], dtype=torch.float)
        ids, mask = ids.to(DEV), mask.to(DEV)
        logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * mask[:, 1:]).sum() / mask[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()


def generate(model, tok, prompts, n):
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(DEV)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    return [tok.decode(o[enc["input_ids"].shape[1]:], skip_special_tokens=True) for o in out]


def units_eval(model, tok, system, rows):
    import unitconv

    first = [tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": r["question"]}],
                                     tools=TOOLS, add_generation_prompt=True, tokenize=False) for r in rows]
    calls, second, right_args, results = generate(model, tok, first, 80), [], [], []
    for r, p, out in zip(rows, first, calls):
        args = (_parse_call(out) or {}).get("arguments") or {}
        ok = args == {"value": r["value"], "from_unit": r["from_unit"], "to_unit": r["to_unit"]}
        right_args.append(ok)
        try:
            result = unitconv.convert_text(args["value"], args["from_unit"], args["to_unit"])
        except (KeyError, TypeError, ValueError) as e:
            result = f"Error: {e}"
        results.append(result)
        second.append(p + out.strip() + "<|im_end|>\n<|im_start|>user\n<tool_response>\n" + result
                      + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    answers = generate(model, tok, second, 32)
    good = [("<answer>" in o and o.split("<answer>")[-1].split("</answer>")[0].strip() in r["answer"])
            for r, o in zip(rows, answers)]
    copied = sum(g for g, a in zip(good, right_args) if a)
    misses = [f"{res!r} -> {o.strip()!r}" for g, a, res, o in zip(good, right_args, results, answers) if a and not g]
    return {"args": sum(right_args) / len(rows), "acc": sum(good) / len(rows),
            "answer_copy": copied / max(1, sum(right_args)), "misses": misses[:6]}


def run(name: str, recipe: dict | None, model_dir: str | None = None, sfts: list[dict] | None = None) -> dict:
    import units_env

    torch.set_num_threads(1)
    base = model_dir or resolve_model("tiny:1m")
    tok = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base).to(DEV)
    res: dict = {"name": name, "recipe": recipe}
    if recipe is not None:
        kw = dict(recipe)
        seed = kw.pop("seed", 0)
        start = time.time()
        pretrain_copy(model, tok, seed, CopyRecipe(**kw), log=lambda m: print(m, file=sys.stderr, flush=True),
                      name=name)
        res["pretrain_s"] = round(time.time() - start, 1)
        if os.environ.get("UNITS_TRIAL_SAVE"):  # keep the pretrained base for later trials
            model.save_pretrained(Path(os.environ["UNITS_TRIAL_SAVE"]) / name)
            tok.save_pretrained(Path(os.environ["UNITS_TRIAL_SAVE"]) / name)
    env = units_env.UnitsEnv(seed=1)
    items = demo_items(tok, [env.solve(r) for r in env.load_split("train")])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for s in sfts or SFTS:
        model.load_state_dict(state)
        sft(model, tok, items, **s)
        res[json.dumps(s)] = units_eval(model, tok, units_env.SYSTEM, env.load_split("test"))
    return res


if __name__ == "__main__":
    import multiprocessing as mp

    args = sys.argv[1:]
    sfts = SFTS
    if "--sft" in args:
        at = args.index("--sft")
        sfts = [SFTS[int(args[at + 1])]]
        del args[at:at + 2]
    if args[:1] == ["--model"]:  # one built base (e.g. a cached tiny:1m-copy), in this process
        results = [run(Path(args[1]).name, None, args[1], sfts)]
    elif len(args) == 1:
        results = [run(args[0], JOBS[args[0]], None, sfts)]
    else:
        which = args or list(JOBS)
        with mp.get_context("spawn").Pool(len(which)) as pool:
            results = [r.get() for r in [pool.apply_async(run, (n, JOBS[n], None, sfts)) for n in which]]
    for r in results:
        for k, v in r.items():
            if isinstance(v, dict) and "acc" in v:
                print(f"{r['name']:12s} sft {k}: right arguments {v['args']:.2f}, right answers {v['acc']:.2f}, "
                      f"answer copied after a right call {v['answer_copy']:.2f}")
                for m in v["misses"]:
                    print(f"    {m}")
