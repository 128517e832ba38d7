"""Diagnostic (issue 29): on 'When was X born?' training trajectories that searched, how often the model
predicts (argmax, teacher-forced after `<answer> 19`) the year's 3rd and 4th digit from the passage.

    .venv/bin/python benchmarks/credit_probes/year_digits.py MODEL GRPO_RUN/trajectories
"""
import json, glob, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
mp = sys.argv[1]; trajdir = sys.argv[2]
tok = AutoTokenizer.from_pretrained(mp); model = AutoModelForCausalLM.from_pretrained(mp).eval()
digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
rows = []
for f in sorted(glob.glob(trajdir + '/step_*.jsonl'))[-60:]:
    for line in open(f):
        t = json.loads(line)
        if t['info']['question'].startswith('When was') and t['tool_calls'] and t['segments'][2]['role'] == 'observation':
            rows.append(t)
seen=set(); tot=0; hits=[0,0]; n=0
for t in rows:
    if t['group'] in seen: continue
    seen.add(t['group'])
    gold = t['info']['golden_answers'][0]
    ids = []
    for s in t['segments'][:3]: ids += s['token_ids']
    pre = tok("<answer> 19", add_special_tokens=False)['input_ids']
    for pos in (2, 3):
        ctx = ids + pre + [tok.convert_tokens_to_ids(c) for c in gold[2:pos]]
        with torch.no_grad():
            lp = model(torch.tensor([ctx])).logits[0, -1].log_softmax(-1)
        p = lp[digits].exp()
        hits[pos-2] += int(p.argmax()) == int(gold[pos])
        if n < 4: print(gold, pos, 'p(gold)=%.3f' % p[int(gold[pos])].item(), 'argmax', int(p.argmax()), 'top p %.2f' % p.max().item())
    n += 1
    if n >= 40: break
print(mp, 'groups', n, 'argmax right: 3rd digit', hits[0], '4th', hits[1])
