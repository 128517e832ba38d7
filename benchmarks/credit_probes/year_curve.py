"""Probe (issue 29): the demo's SFT (examples/demo.yaml plus KEY=VALUE overrides) with the year-copy probe of
year_digits.py run every 50 steps, to see when (if) the warm start learns to copy "When was X born?"'s year.
The runs of 2026-11-28 set LR=constant, which kept the lr at sft.lr after warm-up; that is now the config key
`sft.lr_schedule=constant` (the same factor). FREEZE_DIGITS=1 keeps the
digit tokens' embeddings (tied: input and output) at their initial values; SEARCHED_STEPS=K trains the first K
model-token steps on the demonstrations that searched only.

    .venv/bin/python benchmarks/credit_probes/year_curve.py OUT [KEY=VALUE ...]   # e.g. sft.lr_schedule=constant

The probe reads 40 searched "When was X born?" trajectories from TRAJ (default: the cf1 run's GRPO trajectories).
"""
import asyncio, os, sys, torch
from rlfactory.cli.common import load_run_config
from rlfactory.tiny import resolve_model
import rlfactory.train.sft as sftmod
sys.path.insert(0, os.path.dirname(__file__))
from year_digits import probe_rows, year_hits

out = sys.argv[1]; extra = sys.argv[2:]
rows = probe_rows(os.environ.get("TRAJ", "/work/exp/cf1/grpo/trajectories"))

orig_train = sftmod.sft_train
def train(model, demos, pad_id, cfg, log=None, pixels=None):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(resolve_model(str(cfg_all.model.path)))
    def log2(row):
        if log: log(row)
        if row["step"] % 50 == 0:
            h = year_hits(model, tok, rows)
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
cfg_all = load_run_config("examples/demo.yaml", [f"sft.out={out}", "sft.check_rows=0"] + extra)
from rlfactory.cli.sft import run_sft
asyncio.run(run_sft(cfg_all))
