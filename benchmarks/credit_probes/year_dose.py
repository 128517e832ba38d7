"""Probe (issue 29): does a larger dose of searched 'When was X born?' demonstrations (counterfactual years) make the warm
start copy years? Duplicates those demonstrations DOSE-1 more times, runs the demo's SFT.

    .venv/bin/python benchmarks/credit_probes/year_dose.py DOSE OUT [KEY=VALUE ...]
"""
import asyncio, sys
from rlfactory.cli.common import load_run_config
import rlfactory.train.sft as sftmod
dose = int(sys.argv[1]); out = sys.argv[2]; extra = sys.argv[3:]
orig = sftmod.write_demonstrations
def patched(env, tm, tools, n, label=None, seed=0):
    d = orig(env, tm, tools, n, label, seed=seed)
    add = [w for w in d._written if w[0]["extra_info"]["relations"] == ["birth_year"] and any(m["role"] == "tool" for m in w[1])]
    print("year searched demos", len(add), "of", len(d), file=sys.stderr)
    for _ in range(dose - 1):
        d._written.extend(add)
    return d
sftmod.write_demonstrations = patched
cfg = load_run_config("examples/demo.yaml", ["env.options.counterfactual_rate=1.0", f"sft.out={out}", "sft.check_rows=0"] + extra)
from rlfactory.cli.sft import run_sft
asyncio.run(run_sft(cfg))
