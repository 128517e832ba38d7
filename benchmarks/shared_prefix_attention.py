"""One decode step's attention of one layer on tiny:1m shapes: one-pass (today's packed GQA sdpa over
each row's whole cache) vs shared-prefix (the prefix read once for all rows, shared_prefix.py).

    .venv/bin/python benchmarks/shared_prefix_attention.py [--rows 8 32 128] [--suffix 0 50 100 200]

tiny:1m: 4 query heads, 2 KV heads of 32; the rollout benchmark's shared system-and-tools prefix is
297 tokens. Rows read from a slot cache of 256 slots x 1024 columns (views, as in decode steps);
each row's own columns after the prefix are drawn in [0, suffix] (the longest has `suffix`), its
current token included. Prints the median of interleaved repeats per shape and the ratio, and the
largest difference of the two outputs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rlfactory.generation.gqa_attention import packed_decode_attention
from rlfactory.generation.shared_prefix import prefix_decode_attention


def case(rows: int, prefix: int, suffix: int, heads: int, kv_heads: int, dim: int, gen: torch.Generator):
    slots, columns = 256, 1024
    buf_k = torch.randn(slots, kv_heads, columns, dim, generator=gen)
    buf_v = torch.randn(slots, kv_heads, columns, dim, generator=gen)
    pk, pv = buf_k[0, :, :prefix].clone(), buf_v[0, :, :prefix].clone()
    buf_k[:, :, :prefix] = pk
    buf_v[:, :, :prefix] = pv
    own = torch.randint(0, suffix + 1, (rows,), generator=gen)
    own[0] = suffix
    length = prefix + own  # the column each row writes now
    width = int(length.max()) + 1
    q = torch.randn(rows, heads, 1, dim, generator=gen)
    mask = (torch.arange(width)[None, :] <= length[:, None])[:, None, None, :]
    return q, buf_k[:rows, :, :width], buf_v[:rows, :, :width], mask, pk, pv


def timed(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[8, 32, 64, 128])
    p.add_argument("--suffix", type=int, nargs="+", default=[0, 50, 100, 200])
    p.add_argument("--prefix", type=int, default=297)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--calls", type=int, default=30, help="calls per timed repeat")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    scale = 32 ** -0.5
    print(f"one layer's decode attention, tiny:1m shapes (4 heads, 2 KV heads, head 32), prefix {args.prefix}, "
          f"torch threads {args.threads}, median of {args.repeats} x {args.calls} calls")
    print(f"{'rows':>5} {'suffix':>6} {'one-pass us':>11} {'shared us':>10} {'ratio':>6} {'max diff':>9}")
    with torch.inference_mode():
        for rows in args.rows:
            for suffix in args.suffix:
                q, k, v, mask, pk, pv = case(rows, args.prefix, suffix, 4, 2, 32, gen)
                old = lambda: packed_decode_attention(q, k, v, mask, scale)  # noqa: E731
                new = lambda: prefix_decode_attention(q, k, v, mask, scale, pk, pv, None)  # noqa: E731
                diff = float((old() - new()).abs().max())
                a, b = [], []
                for _ in range(args.repeats):  # interleaved: both sides see the same load
                    a.append(timed(old, args.calls))
                    b.append(timed(new, args.calls))
                ma, mb = statistics.median(a) * 1e6, statistics.median(b) * 1e6
                print(f"{rows:>5} {suffix:>6} {ma:>11.1f} {mb:>10.1f} {ma / mb:>5.2f}x {diff:>9.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
