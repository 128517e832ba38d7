"""Probe (issue 29): the demo's SFT (examples/demo.yaml plus KEY=VALUE overrides) with the year-copy probe of
year_digits.py run every 50 steps, to see when (if) the warm start learns to copy "When was X born?"'s year.
LR=constant keeps the lr at sft.lr after warm-up (the default decays linearly to 0.1x); FREEZE_DIGITS=1 keeps the
digit tokens' embeddings (tied: input and output) at their initial values; SEARCHED_STEPS=K trains the first K
model-token steps on the demonstrations that searched only.

    LR=constant .venv/bin/python benchmarks/credit_probes/year_curve.py OUT [KEY=VALUE ...]

The probe reads 40 searched "When was X born?" trajectories from TRAJ (default: the cf1 run's GRPO trajectories).
"""
import asyncio, glob, json, os, sys, torch
from rlfactory.cli.common import load_run_config
import rlfactory.train.sft as sftmod

out = sys.argv[1]; extra = sys.argv[2:]
TRAJ = os.environ.get("TRAJ", "/work/exp/cf1/grpo/trajectories")
if os.environ.get("LR") == "constant":
    sftmod._lr_factor = lambda step, cfg: min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0

rows, seen = [], set()
for f in sorted(glob.glob(TRAJ + "/step_*.jsonl"))[-60:]:
    for line in open(f):
        t = json.loads(line)
        if (t["info"]["question"].startswith("When was") and t["tool_calls"] and t["segments"][2]["role"] == "observation"
                and t["group"] not in seen and len(rows) < 40):
            seen.add(t["group"]); rows.append(t)

def probe(model, tok):
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    pre = tok("<answer> 19", add_special_tokens=False)["input_ids"]
    hits = [0, 0]
    was = model.training; model.eval()
    with torch.no_grad():
        for t in rows:
            gold = t["info"]["golden_answers"][0]
            ids = [i for s in t["segments"][:3] for i in s["token_ids"]]
            for pos in (2, 3):
                ctx = ids + pre + [tok.convert_tokens_to_ids(c) for c in gold[2:pos]]
                lp = model(torch.tensor([ctx])).logits[0, -1]
                hits[pos - 2] += int(lp[digits].argmax()) == int(gold[pos])
    model.train(was)
    return hits

orig_train = sftmod.sft_train
def train(model, demos, pad_id, cfg, log=None, pixels=None):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(cfg_all.model.path if os.path.isdir(str(cfg_all.model.path)) else TOKDIR)
    def log2(row):
        if log: log(row)
        if row["step"] % 50 == 0:
            h = probe(model, tok)
            print(f"year probe step {row['step']}: 3rd {h[0]}/40 4th {h[1]}/40 loss {row['loss']:.3f} lr {row['lr']:.2e}", file=sys.stderr, flush=True)
    k = int(os.environ.get("SEARCHED_STEPS", "0"))
    if k:  # steps [full_text_steps, full_text_steps + k) draw from the demonstrations that searched only
        searched = [j for j, w in enumerate(demos._written) if any(m["role"] == "tool" for m in w[1])]
        class View:
            only = False
            def __init__(self, all_demos): self.all = all_demos
            def __len__(self): return len(searched) if self.only else len(self.all)
            def __getitem__(self, i): return self.all[searched[i]] if self.only else self.all[i]
        view = View(demos)
        first = cfg.full_text_steps
        def log3(row, inner=log2):
            inner(row)
            view.only = first <= row["step"] < first + k
        view.only = first == 0
        print(f"searched-only steps {first}..{first + k}: {len(searched)} of {len(demos)} demonstrations", file=sys.stderr)
        demos, log2 = view, log3
    if os.environ.get("FREEZE_DIGITS"):
        ids = torch.tensor([tok.convert_tokens_to_ids(str(d)) for d in range(10)])
        model.get_input_embeddings().weight.register_hook(lambda g: g.index_fill(0, ids, 0.0))
    return orig_train(model, demos, pad_id, cfg, log2, pixels)
sftmod.sft_train = train
TOKDIR = os.path.expanduser("~/.cache/rlfactory/tiny-1m-seed0")
cfg_all = load_run_config("examples/demo.yaml", [f"sft.out={out}", "sft.check_rows=0"] + extra)
from rlfactory.cli.sft import run_sft
asyncio.run(run_sft(cfg_all))
