"""Diagnostic (issue 29): can the tiny model learn to copy a year at all? Fine-tune a warm start on
'When was X born?' search trajectories of half the people (from a GRPO run's trajectories), with the
year in the passage and in the answer drawn anew for every example (1900-1999, so it cannot be
memorised), and print how often it predicts the year's last two digits (argmax, teacher-forced) on
the other half's real passages. With a fourth argument `fixed`, the years stay as they are (each
fixed to its person, as in the demo's demonstrations).

    .venv/bin/python benchmarks/credit_probes/year_copy.py WARM_MODEL GRPO_RUN/trajectories STEPS [fixed]
"""
import json, glob, sys, random, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
mp, trajdir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
fixed = sys.argv[4:] == ['fixed']
torch.manual_seed(0)
tok = AutoTokenizer.from_pretrained(mp); model = AutoModelForCausalLM.from_pretrained(mp)
by_person = {}
for f in sorted(glob.glob(trajdir + '/step_*.jsonl')):
    for line in open(f):
        t = json.loads(line)
        q = t['info']['question']
        if q.startswith('When was') and len(t['segments']) >= 3 and t['segments'][2]['role'] == 'observation':
            by_person.setdefault(q, t)
names = sorted(by_person); random.Random(0).shuffle(names)
half = len(names) // 2
def sample(t):
    ctx = []
    for s in t['segments'][:3]: ctx += s['token_ids']
    ans = tok("<answer> " + t['info']['golden_answers'][0] + " </answer>", add_special_tokens=False)['input_ids']
    return ctx, ans
train = [sample(by_person[n]) for n in names[:half]]; test = [sample(by_person[n]) for n in names[half:]]
print('persons: train', len(train), 'test', len(test))
digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
def probe():
    model.eval(); right = tot = 0
    with torch.no_grad():
        for ctx, ans in test:
            ids = torch.tensor([ctx + ans])
            logits = model(ids).logits[0]
            for k in (4, 5):  # the year's 3rd and 4th digits: positions in ans (<answer>, ' ', '1', '9', d3, d4)
                pos = len(ctx) + k
                right += int(logits[pos - 1].argmax()) == ans[k]; tot += 1
    model.train(); return right / tot
print('before: held-out digit accuracy %.3f' % probe())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model.train()
for step in range(steps):
    rr = random.Random(step)
    batch = []
    for c, a in rr.sample(train, 16):
        if fixed:
            batch.append((c, a))
            continue
        y = [digits[int(ch)] for ch in str(rr.randint(1900, 1999))]
        c = list(c); a = list(a)
        for i in range(len(c) - 3):
            if c[i] == digits[1] and c[i + 1] == digits[9] and c[i+2] in digits and c[i+3] in digits:
                c[i:i + 4] = y
        a[2:6] = y
        batch.append((c, a))
    L = max(len(c) + len(a) for c, a in batch)
    ids = torch.zeros((16, L), dtype=torch.long); lab = torch.full((16, L), -100); att = torch.zeros((16, L), dtype=torch.long)
    for i, (c, a) in enumerate(batch):
        s = c + a; ids[i, :len(s)] = torch.tensor(s); att[i, :len(s)] = 1; lab[i, len(c):len(s)] = torch.tensor(a)
    loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
    opt.zero_grad(); loss.backward(); opt.step()
    if (step + 1) % 50 == 0:
        print(step + 1, 'loss %.3f' % loss.item(), 'held-out digit accuracy %.3f' % probe(), flush=True)
