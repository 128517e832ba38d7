"""`rlfactory serve`: rlfactory's local generator (continuous batching, KV cache) behind the vLLM
completions and SGLang `/generate` wire formats, with weight updates and a policy version.

    ServedModel   the generator, its policy version and the update gate (served.py)
    build_app     the HTTP routes (app.py); request/response shapes in api.py
    ServeProcess  start and stop `rlfactory serve` as a subprocess (process.py)
"""
