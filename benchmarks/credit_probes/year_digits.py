"""Diagnostic (issue 29): on 'When was X born?' training trajectories that searched, how often the model
predicts (argmax, teacher-forced after `<answer> 19`) the year's 3rd and 4th digit from the passage.

    .venv/bin/python benchmarks/credit_probes/year_digits.py MODEL GRPO_RUN/trajectories
"""
import glob
import json
import sys

import torch


def probe_rows(trajdir: str, n: int = 40) -> list[dict]:
    """The first searched year-form trajectory of each of `n` groups in the run's last 60 steps."""
    rows, seen = [], set()
    for f in sorted(glob.glob(trajdir + "/step_*.jsonl"))[-60:]:
        for line in open(f):
            t = json.loads(line)
            if (t["info"]["question"].startswith("When was") and t["tool_calls"]
                    and t["segments"][2]["role"] == "observation" and t["group"] not in seen and len(rows) < n):
                seen.add(t["group"])
                rows.append(t)
    return rows


def year_hits(model, tok, rows: list[dict], show: int = 0) -> list[int]:
    """[3rd digit right, 4th digit right] by argmax over the ten digits, counted over `rows`; prints the
    first `show` rows' probabilities."""
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    pre = tok("<answer> 19", add_special_tokens=False)["input_ids"]
    hits = [0, 0]
    was = model.training
    model.eval()
    with torch.no_grad():
        for k, t in enumerate(rows):
            gold = t["info"]["golden_answers"][0]
            ids = [i for s in t["segments"][:3] for i in s["token_ids"]]
            for pos in (2, 3):
                ctx = ids + pre + [tok.convert_tokens_to_ids(c) for c in gold[2:pos]]
                p = model(torch.tensor([ctx])).logits[0, -1].log_softmax(-1)[digits].exp()
                hits[pos - 2] += int(p.argmax()) == int(gold[pos])
                if k < show:
                    print(gold, pos, "p(gold)=%.3f" % p[int(gold[pos])].item(), "argmax", int(p.argmax()),
                          "top p %.2f" % p.max().item())
    model.train(was)
    return hits


if __name__ == "__main__":
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mp, trajdir = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(mp)
    model = AutoModelForCausalLM.from_pretrained(mp)
    rows = probe_rows(trajdir)
    hits = year_hits(model, tok, rows, show=2)
    print(mp, "groups", len(rows), "argmax right: 3rd digit", hits[0], "4th", hits[1])
