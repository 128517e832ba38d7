"""Probe (issue 29): from a warm start, continue SFT (model tokens, counterfactual years) on (a) every searched
demo or (b) only the searched year-form demos, and print the year-digit probe every 100 steps.

    .venv/bin/python benchmarks/credit_probes/continue_sft.py WARM_MODEL year|searched STEPS GRPO_RUN/trajectories
"""
import asyncio, sys, json, glob, torch
from rlfactory.cli.common import load_run_config
from rlfactory.config import SftConfig
import rlfactory.train.sft as sftmod
from transformers import AutoModelForCausalLM, AutoTokenizer
warm, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = load_run_config("examples/demo.yaml", ["env.options.counterfactual_rate=1.0", f"model.path={warm}"])
from rlfactory.train.session import open_rollout, pad_id_of
tok = AutoTokenizer.from_pretrained(warm)
digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
rows = []
for f in sorted(glob.glob(sys.argv[4] + '/step_*.jsonl'))[-60:]:
    for line in open(f):
        t = json.loads(line)
        if t['info']['question'].startswith('When was') and t['tool_calls'] and t['segments'][2]['role'] == 'observation':
            rows.append(t)
seen = {}
for t in rows: seen.setdefault(t['group'], t)
probe_rows = list(seen.values())[:40]
def probe(model):
    model.eval(); hits = 0; n = 0
    with torch.no_grad():
        for t in probe_rows:
            ctx = [i for s in t['segments'][:3] for i in s['token_ids']]
            ans = tok("<answer> " + t['info']['golden_answers'][0] + " </answer>", add_special_tokens=False)['input_ids']
            ids = torch.tensor([ctx + ans]); lg = model(ids).logits[0]
            for k in (4, 5):
                hits += int(lg[len(ctx) + k - 1].argmax()) == ans[k]; n += 1
    model.train(); return hits / n
async def main():
    async with open_rollout(cfg) as s:
        d = sftmod.write_demonstrations(s.env, s.tool_manager, s.runner.specs(), 6144, "search")
        keep = [w for w in d._written if any(m["role"] == "tool" for m in w[1])
                and (mode == "searched" or w[0]["extra_info"]["relations"] == ["birth_year"])]
        d._written = keep
        print(mode, len(keep), "demos; probe before", probe(s.model), flush=True)
        for r in range(steps // 100):
            sc = SftConfig(steps=100, batch_size=32, lr=1e-3, warmup_steps=1, seed=r)
            sftmod.sft_train(s.model, d, pad_id_of(s.tokenizer, s.model), sc)
            print(mode, (r + 1) * 100, "probe", probe(s.model), flush=True)
asyncio.run(main())
