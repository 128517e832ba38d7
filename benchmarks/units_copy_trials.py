"""Trials behind examples/units' settings (README "Your own task"): copy-pretraining recipes for
`tiny:1m-copy` crossed with warm-start settings, scored on the units env's seed-1 rows (never the
held-out split, which is seed 0's test rows).

Each job pretrains `tiny:1m` with a CopyRecipe (rlfactory/tiny/pretrain.py; "none": no
pretraining), then for each SFT setting fine-tunes a copy on 300 seed-1 demonstrations (the env's
solver, rendered by the chat template; loss on the assistant's turns, or on the whole text for
the first `full_text_steps`; AdamW, 10 warm-up steps, linear decay to 10%, as `rlfactory sft`)
and answers seed-1's 100 test questions greedily in two turns (the call, then the answer after
the tool text from unitconv.py, the function the server runs). Prints the share of calls with
exactly the right arguments and of right answers. Jobs run in parallel processes, on CUDA when
there is one (the figures in benchmarks/results/own_task.txt came from an H100).

    python benchmarks/units_copy_trials.py [JOB ...]
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
JOBS: dict[str, dict | None] = {"none": None}
JOBS.update({f"c{n}lr1s{s}": dict(steps=n, lr=1e-3, seed=s) for n in (900, 1200) for s in (0, 1, 2)})


def demo_items(tok, demos):
    """(token ids, loss mask on the assistant's turns) for each demonstration."""
    items = []
    for msgs in demos:
        text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        first = text.find("<|im_start|>assistant\n")
        i = text.find("<tool_call>", first)
        spans = [(i, text.find("<|im_end|>", i) + len("<|im_end|>"))]
        i = text.rfind("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
        spans.append((i, text.rfind("<|im_end|>") + len("<|im_end|>")))
        items.append((enc["input_ids"], [int(any(a <= s < b for a, b in spans)) for s, _ in enc["offset_mapping"]]))
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
    calls, second, right = generate(model, tok, first, 80), [], 0
    for r, p, out in zip(rows, first, calls):
        args = (_parse_call(out) or {}).get("arguments") or {}
        right += args == {"value": r["value"], "from_unit": r["from_unit"], "to_unit": r["to_unit"]}
        try:
            result = unitconv.convert_text(args["value"], args["from_unit"], args["to_unit"])
        except (KeyError, TypeError, ValueError) as e:
            result = f"Error: {e}"
        second.append(p + out.strip() + "<|im_end|>\n<|im_start|>user\n<tool_response>\n" + result
                      + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    answers = generate(model, tok, second, 24)
    acc = sum(o.split("<answer>")[-1].split("</answer>")[0].strip() in r["answer"]
              for r, o in zip(rows, answers) if "<answer>" in o)
    return {"args": right / len(rows), "acc": acc / len(rows)}


def run(name: str, recipe: dict | None) -> dict:
    import units_env

    torch.set_num_threads(1)
    base = resolve_model("tiny:1m")
    tok = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base).to(DEV)
    res: dict = {"name": name, "recipe": recipe}
    if recipe is not None:
        kw = dict(recipe)
        seed = kw.pop("seed", 0)
        start = time.time()
        pretrain_copy(model, tok, seed, CopyRecipe(**kw), log=lambda m: None)
        res["pretrain_s"] = round(time.time() - start, 1)
    env = units_env.UnitsEnv(seed=1)
    items = demo_items(tok, [env.solve(r) for r in env.load_split("train")])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for s in SFTS:
        model.load_state_dict(state)
        sft(model, tok, items, **s)
        res[json.dumps(s)] = units_eval(model, tok, units_env.SYSTEM, env.load_split("test"))
    return res


if __name__ == "__main__":
    import multiprocessing as mp

    which = sys.argv[1:] or list(JOBS)
    with mp.get_context("spawn").Pool(len(which)) as pool:
        results = [r.get() for r in [pool.apply_async(run, (n, JOBS[n])) for n in which]]
    for r in results:
        for k, v in r.items():
            if isinstance(v, dict) and "acc" in v:
                print(f"{r['name']:12s} sft {k}: right arguments {v['args']:.2f}, right answers {v['acc']:.2f}")
