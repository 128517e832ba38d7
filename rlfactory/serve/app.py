"""The HTTP routes of `rlfactory serve` (starlette).

    POST /v1/completions            vLLM completions subset: token-id prompt, return_token_ids, logprobs 0
    POST /generate                  SGLang subset: input_ids, return_logprob, image_data (a VL model)
    POST /update_weights_from_disk  SGLang's shape: {"model_path", "weight_version"} -> {"success", "message", ...}
    POST /update_weights_from_tensors  a safetensors body; ?policy_version=N
    POST /release_session           {"session_id"}: drop that trajectory's kept KV cache
    GET  /health                    {"status": "ok", "server": "rlfactory", "policy_version", ...}
    GET  /policy_version, /get_weight_version, /get_model_info, /v1/models
    GET  /weights_digest             {"sha256", "policy_version"}: SHA-256 of the served weights

Every generation answer carries the policy version that produced it (`policy_version` in vLLM's
shape, `meta_info.weight_version` in SGLang's). An update without a version bumps it by one.
Anyone who can reach the port can replace the weights: bind to loopback or a private network.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rlfactory.generation.vision import BadImageRequest
from rlfactory.generation.weights import WeightsMismatch
from rlfactory.serve.api import BadRequest, completions_response, generate_response, parse_completions, parse_generate
from rlfactory.serve.served import ServedModel
from rlfactory.serve.weights import weights_digest


def _error(message: str, status: int = 400) -> JSONResponse:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


async def _json(request: Request) -> Any:
    try:
        return await request.json()
    except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
        raise BadRequest("the body is not valid JSON") from None


def _version_arg(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(str(value))
    except ValueError:
        raise BadRequest(f"the weight version must be an integer (rlfactory's policy version), got {value!r}") from None


def build_app(served: ServedModel) -> Starlette:
    tok = served.tokenizer

    async def completions(request: Request) -> JSONResponse:
        try:
            turn = parse_completions(await _json(request), served.eos_ids, served.context, served.vocab)
        except BadRequest as e:
            return _error(str(e))
        result, version = await served.generate(turn.request)
        return JSONResponse(completions_response(turn, result, version, served.name, tok))

    async def generate(request: Request) -> JSONResponse:
        t0 = time.perf_counter()
        try:
            turn = parse_generate(await _json(request), served.eos_ids, served.context, served.vocab)
            if turn.request.images and not served.takes_images:
                raise BadRequest(f"`image_data`: {served.name} is not a vision-language model; it takes no images")
            result, version = await served.generate(turn.request)
        except (BadRequest, BadImageRequest) as e:
            return _error(str(e))
        return JSONResponse(generate_response(turn, result, version, tok, time.perf_counter() - t0))

    async def update_from_disk(request: Request) -> JSONResponse:
        try:
            body = await _json(request)
            if not isinstance(body, dict) or not isinstance(body.get("model_path"), str) or not body["model_path"]:
                raise BadRequest("`model_path` (a folder with .safetensors weights) is required")
            if body.get("abort_all_requests"):
                raise BadRequest("`abort_all_requests` is not supported: an update waits for the turns in flight")
            version = _version_arg(body.get("weight_version"))
            new = await served.update_from_disk(body["model_path"], version)
        except (BadRequest, WeightsMismatch, FileNotFoundError) as e:
            return JSONResponse({"success": False, "message": str(e), "num_paused_requests": 0}, status_code=400)
        return JSONResponse({"success": True, "message": f"Succeeded to update model weights. Weight version updated to {new}.",
                             "num_paused_requests": 0, "policy_version": new})

    async def update_from_tensors(request: Request) -> JSONResponse:
        from safetensors import SafetensorError
        from safetensors.torch import load

        try:
            version = _version_arg(request.query_params.get("policy_version"))
            data = await request.body()
            try:
                tensors = load(data)
            except (SafetensorError, ValueError, OSError) as e:
                raise BadRequest(f"the body is not a safetensors file: {e}") from None
            new = await served.update_from_tensors(tensors, version)
        except (BadRequest, WeightsMismatch) as e:
            return JSONResponse({"success": False, "message": str(e)}, status_code=400)
        return JSONResponse({"success": True, "message": f"Weight version updated to {new}.", "policy_version": new})

    async def release_session(request: Request) -> JSONResponse:
        try:
            body = await _json(request)
        except BadRequest as e:
            return _error(str(e))
        session = body.get("session_id") if isinstance(body, dict) else None
        if not isinstance(session, str):
            return _error("`session_id` (a string) is required")
        return JSONResponse({"released": served.release(session)})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse(served.health())

    async def policy_version(request: Request) -> JSONResponse:
        return JSONResponse({"policy_version": served.version})

    async def weight_version(request: Request) -> JSONResponse:
        return JSONResponse({"weight_version": str(served.version)})

    async def model_info(request: Request) -> JSONResponse:
        return JSONResponse({"model_path": served.name, "is_generation": True, "weight_version": str(served.version)})

    async def digest(request: Request) -> JSONResponse:
        version = served.version
        return JSONResponse({"sha256": await asyncio.to_thread(weights_digest, served.model), "policy_version": version})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": served.name, "object": "model", "owned_by": "rlfactory",
                                                         "max_model_len": served.context or None}]})

    return Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/generate", generate, methods=["POST"]),
        Route("/update_weights_from_disk", update_from_disk, methods=["POST"]),
        Route("/update_weights_from_tensors", update_from_tensors, methods=["POST"]),
        Route("/release_session", release_session, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/policy_version", policy_version, methods=["GET"]),
        Route("/get_weight_version", weight_version, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/weights_digest", digest, methods=["GET"]),
    ])
