"""The request and response shapes `rlfactory serve` speaks, server side: the subset of vLLM's
`/v1/completions` and SGLang's `/generate` that token-in/token-out rollouts use (the client side is
rlfactory/generation/server_api.py). A request outside the subset (a text prompt, n > 1, streaming,
top logprobs) is refused with a 400 that names the field.

Stops: a turn ends on the request's `stop_token_ids`, on the model's EOS tokens unless
`ignore_eos` is set, on a `stop` string (the token that completes it is kept), or at the length.
The returned token ids always hold every sampled token, the stop token last; the `text` follows
each API's trimming rule. `seed` / `sampling_seed` are accepted, but the server samples from one
random generator (seeded with `rlfactory serve --seed`), since turns of many requests share a batch.

Images: `/generate` takes SGLang's `image_data` with `input_ids` (one request: a list of images in
the order of their pads, or one image), each a `data:` URL or bare base64; URLs and file names are
not read. The ids hold each image's pads already expanded (what the client's VL ToolManager
renders); the server checks their count against its image processor's grid. vLLM's
`/v1/completions` takes no images (as vLLM's own), so an image field there is refused.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rlfactory.config import SamplingConfig
from rlfactory.images import Image, ImageError, image_from_base64, image_from_value
from rlfactory.protocols import GenRequest, GenResult


class BadRequest(ValueError):
    """The request is outside what `rlfactory serve` accepts; the message names the field."""


@dataclass
class Turn:
    """One parsed generation request and the options that shape its answer."""

    request: GenRequest
    logprobs: bool
    return_token_ids: bool
    skip_special_tokens: bool
    keep_stop: bool
    """vLLM include_stop_str_in_output / SGLang no_stop_trim: the stop string stays in `text`."""
    request_id: str
    given_stop_ids: tuple[int, ...] = ()
    """The request's own stop token ids (the model's EOS ids are added to the request's set)."""


def _field(body: dict, name: str, kind: type | tuple, default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise BadRequest(f"`{name}` must be a number, got {value!r}")
    if not isinstance(value, kind):
        raise BadRequest(f"`{name}` must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _ids(value: Any, name: str, vocab: int = 0) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise BadRequest(f"`{name}` must be a non-empty list of token ids (rlfactory serve takes token ids, not text)")
    if vocab and max(value) >= vocab:  # the embedding lookup would raise mid-batch
        raise BadRequest(f"`{name}` holds token id {max(value)}, outside the model's vocabulary of {vocab}")
    return value


def _stops(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    raise BadRequest(f"`{name}` must be a string or a list of strings")


def _sampling(temperature: float, top_p: float, top_k: int) -> SamplingConfig:
    try:
        return SamplingConfig(temperature=max(float(temperature), 0.0), top_p=float(top_p),
                              top_k=0 if top_k in (-1, 0) else int(top_k), greedy=float(temperature) <= 0)
    except ValidationError as e:
        raise BadRequest("; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())) from None


def _stop_ids(given: list[int], ignore_eos: bool, eos: tuple[int, ...]) -> list[int]:
    return list(dict.fromkeys([*given, *(() if ignore_eos else eos)]))


def _check_length(prompt: list[int], max_new: int, context: int) -> None:
    if max_new < 1:
        raise BadRequest("the number of tokens to generate must be >= 1")
    if context and len(prompt) + max_new > context:
        raise BadRequest(f"prompt ({len(prompt)} tokens) + max tokens ({max_new}) exceeds the model's context ({context})")


def _images(value: Any) -> list[Image] | None:
    """SGLang's `image_data` of one request as Images (None: no images)."""
    if value is None or value == []:
        return None
    items = value if isinstance(value, list) else [value]
    if any(isinstance(v, list) for v in items):
        raise BadRequest("`image_data`: the images of one request (a list of strings), not a batch")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise BadRequest(f"`image_data[{i}]` must be a data: URL or base64 string, got {type(item).__name__}")
        try:
            if item.startswith("data:"):
                out.append(image_from_value(item))
            elif "://" in item[:16] or item.lower().endswith((".png", ".jpg", ".jpeg", ".webp", ".gif")):
                raise BadRequest(f"`image_data[{i}]`: rlfactory serve reads images inline only (a data: URL or "
                                 f"base64), not URLs or file names: got {item[:60]!r}")
            else:
                out.append(image_from_base64(item))
        except ImageError as e:
            raise BadRequest(f"`image_data[{i}]`: {e}") from None
    return out


# ---- vLLM /v1/completions ---------------------------------------------------------------------

def parse_completions(body: Any, eos: tuple[int, ...], context: int, vocab: int = 0) -> Turn:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    for name in ("image_data", "multi_modal_data"):
        if body.get(name) is not None:
            raise BadRequest(f"`{name}`: /v1/completions takes no images (nor does vLLM's); send them to "
                             "/generate as SGLang's `image_data` with `input_ids`")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        raise BadRequest("`prompt`: one prompt per request (a list of token ids), not a batch")
    prompt = _ids(prompt, "prompt", vocab)
    for name, ok in (("n", 1), ("best_of", 1)):
        if _field(body, name, int, ok) != ok:
            raise BadRequest(f"`{name}` must be 1")
    for name in ("stream", "echo", "use_beam_search"):
        if _field(body, name, bool, False):
            raise BadRequest(f"`{name}` is not supported")
    logprobs = _field(body, "logprobs", int)
    if logprobs not in (None, 0):
        raise BadRequest("`logprobs` must be 0 or null (only the sampled token's logprob is returned)")
    max_new = _field(body, "max_tokens", int, 16)
    _check_length(prompt, max_new, context)
    ignore_eos = _field(body, "ignore_eos", bool, False)
    given = _ids(body["stop_token_ids"], "stop_token_ids") if body.get("stop_token_ids") else []
    sampling = _sampling(_field(body, "temperature", (int, float), 1.0), _field(body, "top_p", (int, float), 1.0),
                         _field(body, "top_k", int, 0))
    session = _field(body, "session_id", str)
    request = GenRequest(prompt, max_new, sampling, _stop_ids(given, ignore_eos, eos), _stops(body.get("stop"), "stop"), session)
    return Turn(request, logprobs == 0, _field(body, "return_token_ids", bool, False),
                _field(body, "skip_special_tokens", bool, True), _field(body, "include_stop_str_in_output", bool, False),
                _field(body, "request_id", str) or f"cmpl-{uuid.uuid4().hex}", tuple(given))


def completions_response(turn: Turn, result: GenResult, version: int, model: str, tokenizer: Any) -> dict[str, Any]:
    req, ids = turn.request, result.token_ids
    stop_string = _matched_stop_string(turn, result, tokenizer)
    if result.finish_reason == "length":
        stop_reason: int | str | None = None
    elif stop_string is not None:
        stop_reason = stop_string
    else:
        stop_reason = result.stop_token if result.stop_token in turn.given_stop_ids else None  # None: the model's EOS
    text = _text(turn, result, tokenizer, stop_string)
    logprobs = None
    if turn.logprobs:
        pieces = [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
        offsets, pos = [], 0
        for p in pieces:
            offsets.append(pos)
            pos += len(p)
        logprobs = {"text_offset": offsets, "token_logprobs": list(result.logprobs), "tokens": pieces,
                    "top_logprobs": [{p: lp} for p, lp in zip(pieces, result.logprobs)]}
    choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": result.finish_reason,
              "stop_reason": stop_reason, "token_ids": list(ids) if turn.return_token_ids else None,
              "prompt_logprobs": None, "prompt_token_ids": list(req.prompt_ids) if turn.return_token_ids else None}
    n_prompt = len(req.prompt_ids)
    return {"id": turn.request_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt + len(ids),
                                           "completion_tokens": len(ids), "prompt_tokens_details": None},
            "service_tier": None, "system_fingerprint": None, "kv_transfer_params": None, "policy_version": version}


# ---- SGLang /generate -------------------------------------------------------------------------

def parse_generate(body: Any, eos: tuple[int, ...], context: int, vocab: int = 0) -> Turn:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if body.get("text") is not None or body.get("input_embeds") is not None:
        raise BadRequest("`text` / `input_embeds` are not supported: send `input_ids`")
    ids = body.get("input_ids")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        raise BadRequest("`input_ids`: one prompt per request, not a batch")
    prompt = _ids(ids, "input_ids", vocab)
    if _field(body, "stream", bool, False):
        raise BadRequest("`stream` is not supported")
    if _field(body, "top_logprobs_num", int, 0) != 0:
        raise BadRequest("`top_logprobs_num` must be 0 (only the sampled token's logprob is returned)")
    start = _field(body, "logprob_start_len", int, -1)
    if start not in (-1, None) and _field(body, "return_logprob", bool, False):
        raise BadRequest("`logprob_start_len` must be -1 (input logprobs are not returned)")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("`sampling_params` must be an object (one request, not a batch)")
    if _field(params, "n", int, 1) != 1:
        raise BadRequest("`sampling_params.n` must be 1")
    max_new = _field(params, "max_new_tokens", int, 128)
    _check_length(prompt, max_new, context)
    ignore_eos = _field(params, "ignore_eos", bool, False)
    given = _ids(params["stop_token_ids"], "stop_token_ids") if params.get("stop_token_ids") else []
    sampling = _sampling(_field(params, "temperature", (int, float), 1.0), _field(params, "top_p", (int, float), 1.0),
                         _field(params, "top_k", int, -1))
    session = _field(body, "session_id", str)
    stops = _stops(params.get("stop"), "sampling_params.stop")
    request = GenRequest(prompt, max_new, sampling, _stop_ids(given, ignore_eos, eos), stops, session,
                         images=_images(body.get("image_data")))
    return Turn(request, _field(body, "return_logprob", bool, False), True, _field(params, "skip_special_tokens", bool, True),
                _field(params, "no_stop_trim", bool, False), _field(body, "rid", str) or uuid.uuid4().hex, tuple(given))


def generate_response(turn: Turn, result: GenResult, version: int, tokenizer: Any, latency_s: float) -> dict[str, Any]:
    stop_string = _matched_stop_string(turn, result, tokenizer)
    if result.finish_reason == "length":
        finish: dict[str, Any] = {"type": "length", "length": len(result.token_ids)}
    else:
        finish = {"type": "stop", "matched": stop_string if stop_string is not None else result.stop_token}
    meta = {"id": turn.request_id, "finish_reason": finish, "prompt_tokens": len(turn.request.prompt_ids),
            "weight_version": str(version), "completion_tokens": len(result.token_ids), "cached_tokens": 0,
            "e2e_latency": latency_s}
    if turn.logprobs:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(result.logprobs, result.token_ids)]
    return {"text": _text(turn, result, tokenizer, stop_string), "output_ids": list(result.token_ids), "meta_info": meta}


# ---- shared -----------------------------------------------------------------------------------

def _matched_stop_string(turn: Turn, result: GenResult, tokenizer: Any) -> str | None:
    if result.finish_reason != "stop" or result.stop_token is not None:
        return None
    text = tokenizer.decode(result.token_ids, skip_special_tokens=False)
    found = [(text.find(s), s) for s in (turn.request.stop_strings or ()) if s and s in text]
    return min(found)[1] if found else None


def _text(turn: Turn, result: GenResult, tokenizer: Any, stop_string: str | None) -> str:
    ids = result.token_ids[:-1] if result.stop_token is not None and not turn.keep_stop else result.token_ids
    text = tokenizer.decode(ids, skip_special_tokens=turn.skip_special_tokens)
    if stop_string is not None and not turn.keep_stop and stop_string in text:
        text = text[: text.index(stop_string)]
    return text
