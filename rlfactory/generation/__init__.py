"""Generation: the `Generator` backends the rollout engine drives through `rlfactory.protocols`.

    gen = LocalGenerator(model, pad_id, tokenizer=tok)          # in-process, continuous batching
    gen = ServerGenerator(urls, "vllm", tok, stop_token_ids)    # vLLM / SGLang servers over HTTP
    results = await gen.generate([GenRequest(prompt_ids, max_new_tokens=64)])

The local backend (`local.py`) batches every request that is ready (continuous batching) over a
KV cache (`kv_cache.py`), with CUDA-graph decode steps on CUDA (`decode_graph.py`); sampling is
seeded per row (`sampling.py`). `VersionedGenerator` (`versioned.py`) holds turns while new
weights are swapped in; `load_weights` (`weights.py`) is the one way a generator's model takes
named weights; `model_source.py` resolves and loads a model from a run's config.

Names are imported lazily, so importing the package does not load the model code. This package
imports the bottom of the house (config, protocols), the leaf helpers `openmp` and `passes`, and
`tiny` (the built-in model), never `rollout` (tests/test_layers.py checks it).
"""

from __future__ import annotations

from rlfactory.lazy import lazy_exports

_EXPORTS = {
    "LocalGenerator": "local",
    "ServerGenerator": "server_generator",
    "VersionedGenerator": "versioned",
    "TurnGate": "versioned",
    "load_weights": "weights",
    "load_model": "model_source",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
