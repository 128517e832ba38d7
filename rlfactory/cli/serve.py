"""`rlfactory serve MODEL [--port 8000] [--max-batch 256] [--host 127.0.0.1]`: serve a model with
rlfactory's local generator (continuous batching, KV cache) over vLLM's completions API and
SGLang's `/generate` (token ids in and out; a vision-language model also takes SGLang's
`image_data`), with weight updates and a policy version."""

from __future__ import annotations

import argparse
import sys

from rlfactory.cli.model_server import add_model_arguments, logits_processor_factory, start


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model for generation over vLLM / SGLang-shaped HTTP (token ids in and out)",
        description=__doc__,
    )
    p.add_argument("model", help="model path as in model.path: tiny:1m, tiny:10m or a Hugging Face folder")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; anyone who can "
                   "reach the port can replace the weights)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-batch", type=int, default=256, help="most sequences decoded in one batch (default 256)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--policy-version", type=int, default=0, help="the version the starting weights count as")
    add_model_arguments(p, "FACTORY(tokenizer) returns a local-generator logits processor applied to every turn, e.g. "
                        "a ScriptedPolicy that makes an untrained model follow a tool-use script (tests, benchmarks); "
                        "the current folder is importable")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not start(args, "serve", max_batch=args.max_batch):
        return 2
    import torch
    import uvicorn

    from rlfactory.generation.model_source import load_model, pick_device
    from rlfactory.train.session import pad_id_of
    from rlfactory.config import ModelConfig
    from rlfactory.serve.app import build_app
    from rlfactory.serve.served import ServedModel, pixel_source

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(ModelConfig(path=args.model, dtype=args.dtype), pick_device(args.device))
    served = ServedModel(model, tokenizer, name=args.model, pad_id=pad_id_of(tokenizer, model), max_batch=args.max_batch,
                         seed=args.seed, version=args.policy_version, pixels=pixel_source(model, tokenizer))
    if args.logits_processor:
        served.generator.logits_processor = logits_processor_factory(args.logits_processor)(tokenizer)
    print(f"rlfactory serve: {args.model} on http://{args.host}:{args.port} (policy version {served.version}, "
          f"max batch {args.max_batch})", file=sys.stderr, flush=True)
    try:
        uvicorn.run(build_app(served), host=args.host, port=args.port, log_level="warning", access_log=False)
    finally:
        served.close()
    return 0

