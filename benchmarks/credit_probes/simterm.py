"""Probe (issue 29): partial credit for an answer close, character by character, to a reference (1 -
edit distance / length). Used as a `module:function` reward term, PYTHONPATH including this folder:

    reward.terms={exact_match: 0.6, 'simterm:char_sim': 0.3, format: 0.1}
"""
from rlfactory.rewards.text import normalize_answer


def _lev(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def char_sim(trajectory, answer=None, references=()):
    if answer is None:
        return 0.0
    a = normalize_answer(answer)
    best = 0.0
    for r in references:
        r = normalize_answer(r)
        n = max(len(a), len(r)) or 1
        best = max(best, 1.0 - _lev(a, r) / n)
    return best
