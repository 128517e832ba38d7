"""Probe (issue 29): the demo's SFT with counterfactual years and each guess's whole answer text (the value and the spaces around it) out of the loss of the model-token steps (the guess
demos still teach answering at once: their "<answer>" token stays in the loss). `learn_guesses: false` keeps the spaces in.

    .venv/bin/python benchmarks/credit_probes/unlearned_guesses.py OUT [KEY=VALUE ...]
"""
import asyncio, sys
from rlfactory.cli.common import load_run_config
from rlfactory.trajectory import Segment, Trajectory
import rlfactory.train.sft as sftmod
out = sys.argv[1]; extra = sys.argv[2:]
orig = sftmod.write_demonstrations
def patched(env, tm, tools, n, label=None, seed=0):
    d = orig(env, tm, tools, n, label, seed=seed)
    k = 0
    for j, (row, msgs, tl, traj) in enumerate(d._written):
        if any(m["role"] == "tool" for m in msgs):
            continue
        p, m = traj.segments
        segs = [p, Segment("model", m.token_ids[:1]), Segment("observation", m.token_ids[1:-2]), Segment("model", m.token_ids[-2:])]
        d._written[j] = (row, msgs, tl, Trajectory(id=traj.id, group=traj.id, segments=segs, turns=1))
        k += 1
    print("guesses masked", k, file=sys.stderr)
    return d
sftmod.write_demonstrations = patched
cfg = load_run_config("examples/demo.yaml", ["env.options.counterfactual_rate=1.0", f"sft.out={out}", "sft.check_rows=0"] + extra)
from rlfactory.cli.sft import run_sft
asyncio.run(run_sft(cfg))
