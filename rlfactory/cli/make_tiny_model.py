"""`rlfactory make-tiny-model`: write rlfactory's tiny tokenizer + Qwen3 model to a directory (with
`--vl`: the tiny Qwen2.5-VL vision-language model, its tokenizer and image processor)."""

from __future__ import annotations

import argparse

from rlfactory.tiny.model import SIZES


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "make-tiny-model",
        help="make a tiny tokenizer + randomly initialised Qwen3 model (offline, deterministic)",
        description="Train a byte-level BPE tokenizer on a generated corpus and save it with a "
        "randomly initialised Qwen3-architecture model as a Hugging Face directory.",
    )
    p.add_argument("--size", choices=sorted(SIZES), default="1m", help="about 1M or 10M parameters")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0, help="seed of the corpus and the weights")
    p.add_argument("--vl", action="store_true",
                   help="the tiny vision-language model instead (Qwen2.5-VL architecture, as tiny-vl:<size>; 1m only)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from rlfactory.tiny.model import MARKER, make_tiny_model

    if args.vl:
        from rlfactory.tiny.vl import VL_SIZES, make_tiny_vl_model

        if args.size not in VL_SIZES:
            print(f"make-tiny-model --vl: no tiny vision-language model of size {args.size!r} "
                  f"(sizes: {', '.join(sorted(VL_SIZES))})")
            return 2
        out = make_tiny_vl_model(args.out, size=args.size, seed=args.seed)
    else:
        out = make_tiny_model(args.out, size=args.size, seed=args.seed)
    info = json.loads((out / MARKER).read_text())
    kind = "tiny vision-language model" if args.vl else "tiny model"
    print(f"{kind} ({args.size}, seed {args.seed}, {info['num_parameters']:,} parameters) written to {out}")
    return 0
