"""The two wire formats the server backend speaks, client side: build a request body for one
model turn, and read the sampled token ids, their logprobs, the finish reason and the policy
version out of the server's answer. Token ids go in and come out; nothing is re-tokenized.

vLLM (`POST /v1/completions`, vllm/entrypoints/openai/completion/protocol.py): the prompt is a
list of token ids; `return_token_ids: true` adds `choices[0].token_ids` (the stop token included);
`logprobs: 0` gives `choices[0].logprobs.token_logprobs`, the sampled token's logprob at each step.
`finish_reason` is "stop" or "length"; `stop_reason` is the stop token id, the stop string, or
null for the model's EOS.

SGLang (`POST /generate`, python/sglang/srt/managers/io_struct.py GenerateReqInput): `input_ids`
and `sampling_params`; `return_logprob: true` adds `meta_info.output_token_logprobs`, one
`[logprob, token_id, text|null]` per sampled token; `no_stop_trim: true` keeps the stop token in
`output_ids`. `meta_info.finish_reason` is `{"type": "stop", "matched": id|str}` or
`{"type": "length", "length": n}`; `meta_info.weight_version` is the server's weight version.

Images (a vision-language model's turn, `GenRequest.images`). SGLang's `/generate` takes them
beside token ids: `image_data`, for one request a list of images in the order of their pads in
`input_ids`, each a URL, a file name or base64 / a `data:` URL (GenerateReqInput.image_data in
python/sglang/srt/managers/io_struct.py; sglang's own token-in/token-out example sends the
processor-expanded `input_ids` with `image_data`:
examples/runtime/token_in_token_out/token_in_token_out_vlm_server.py). We send every image of the
context, each turn, as a `data:` URL (the server re-reads them all; `rlfactory serve` encodes only
those its kept cache does not hold). vLLM's HTTP API cannot carry images with a token-id prompt:
`/v1/completions` (CompletionRequest in vllm/entrypoints/openai/completion/protocol.py) has a
token-id `prompt` but no image field; `/v1/chat/completions` takes `image_url` content parts only
in chat messages that it renders into tokens itself; `/inference/v1/generate`
(vllm/entrypoints/serve/disagg/protocol.py) takes `token_ids` with `features`, but those are the
base64 `MultiModalKwargsItem`s of vLLM's own render step, not pictures. `multi_modal_data` exists
in vLLM's Python API only. So `build_request` refuses images for `vllm` (`ImagesNotCarried`).

Both servers always end a turn on the model's own EOS token as well as on the request's stop
tokens (SGLang's `ignore_eos` would switch off `stop_token_ids` too), except when the request
names no stop token at all: then `ignore_eos` is set and only the length ends the turn.
The shapes are pinned by fixtures in tests/generation/fixtures/ (their sources are named there).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from rlfactory.config import ConfigError, SamplingConfig
from rlfactory.images import Image
from rlfactory.protocols import GenRequest

Api = Literal["vllm", "sglang"]
PATHS: dict[str, str] = {"vllm": "/v1/completions", "sglang": "/generate"}


class MalformedResponse(ValueError):
    """A server answered 200 with a body that is not the documented shape."""


class ImagesNotCarried(ConfigError):
    """A request holds images that the configured server API cannot carry with token ids (a
    config error: `rlfactory` commands print it as one line)."""


VLLM_NO_IMAGES = ("generator.api: vllm cannot send images with token-id prompts (vLLM's /v1/completions has no "
                  "image field; its chat API re-renders the prompt): use generator.api: sglang (SGLang or "
                  "rlfactory serve) or generator.backend: local")


def image_data_url(image: Image) -> str:
    """`image` as a base64 `data:` URL (what SGLang's `image_data` and `rlfactory serve` read)."""
    if image.data is None:
        raise ValueError(f"image {image.sha256[:12]} has no bytes (a reference only): it cannot be sent to a server")
    return f"data:{image.mime};base64," + base64.b64encode(image.data).decode("ascii")


@dataclass
class ServerTurn:
    """What one server answer says about one model turn."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    stop_token: int | None
    """The stop token that ended the turn (the last of token_ids), None for length or a stop string."""
    policy_version: int | None
    """The version the server reports for the weights that produced the turn, when it does."""


def _sampling(s: SamplingConfig) -> tuple[float, float, int]:
    """(temperature, top_p, top_k) with greedy as temperature 0 and top_k off as -1."""
    return (0.0 if s.is_greedy else float(s.temperature)), float(s.top_p), (int(s.top_k) if s.top_k > 0 else -1)


def build_request(api: Api, req: GenRequest, stop_token_ids: Sequence[int], stop_strings: Sequence[str], *,
                  seed: int | None = None, model: str | None = None, session: str | None = None) -> dict[str, Any]:
    """The JSON body for one turn: continue `req.prompt_ids` for at most `req.max_new_tokens`.

    `session` is sent as `session_id` (vLLM's field for related requests; `rlfactory serve` keeps
    that trajectory's KV cache under it). Images go in SGLang's `image_data`; for `vllm` a request
    with images raises ImagesNotCarried (see the module doc)."""
    if req.images and api == "vllm":
        raise ImagesNotCarried(VLLM_NO_IMAGES)
    temperature, top_p, top_k = _sampling(req.sampling)
    stop_ids, stops = [int(t) for t in stop_token_ids], [str(s) for s in stop_strings]
    only_length = not stop_ids
    if api == "vllm":
        body: dict[str, Any] = {
            "prompt": list(req.prompt_ids), "max_tokens": int(req.max_new_tokens), "temperature": temperature,
            "top_p": top_p, "top_k": top_k, "stop": stops, "stop_token_ids": stop_ids, "ignore_eos": only_length,
            "include_stop_str_in_output": True, "skip_special_tokens": False, "logprobs": 0,
            "return_token_ids": True, "n": 1, "stream": False, "echo": False,
        }
        if model:
            body["model"] = model
        if seed is not None:
            body["seed"] = int(seed)
        if session is not None:
            body["session_id"] = session
        return body
    params: dict[str, Any] = {
        "max_new_tokens": int(req.max_new_tokens), "temperature": temperature, "top_p": top_p, "top_k": top_k,
        "stop": stops, "stop_token_ids": stop_ids, "ignore_eos": only_length, "no_stop_trim": True,
        "skip_special_tokens": False, "n": 1,
    }
    if seed is not None:
        params["sampling_seed"] = int(seed)
    body = {"input_ids": list(req.prompt_ids), "sampling_params": params, "return_logprob": True,
            "logprob_start_len": -1, "top_logprobs_num": 0, "stream": False}
    if req.images:
        body["image_data"] = [image_data_url(im) for im in req.images]
    if session is not None:
        body["session_id"] = session
    return body


def parse_response(api: Api, body: Any, stop_token_ids: Sequence[int]) -> ServerTurn:
    """Read one turn out of a server's JSON answer; MalformedResponse names what is wrong."""
    turn = _parse_vllm(body) if api == "vllm" else _parse_sglang(body)
    if len(turn.logprobs) != len(turn.token_ids):
        raise MalformedResponse(f"{len(turn.token_ids)} token ids but {len(turn.logprobs)} logprobs")
    if turn.finish_reason == "stop" and turn.stop_token is None and turn.token_ids and turn.token_ids[-1] in set(stop_token_ids):
        turn.stop_token = turn.token_ids[-1]
    return turn


def _get(body: Any, *path: Any) -> Any:
    cur = body
    for key in path:
        try:
            cur = cur[key]
        except (KeyError, IndexError, TypeError):
            raise MalformedResponse("missing " + "".join(f"[{k!r}]" for k in path)) from None
    return cur


def _ints(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise MalformedResponse(f"{what} is not a list of token ids")
    return list(value)


def _floats(value: Any, what: str) -> list[float]:
    if not isinstance(value, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise MalformedResponse(f"{what} is not a list of numbers")
    return [float(x) for x in value]


def _version(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None  # e.g. SGLang's "default" before any update


def _parse_vllm(body: Any) -> ServerTurn:
    choices = _get(body, "choices")
    if not isinstance(choices, list) or len(choices) != 1:
        raise MalformedResponse("expected exactly one choice")
    choice = choices[0]
    if not isinstance(choice, dict) or choice.get("token_ids") is None:
        raise MalformedResponse("choices[0].token_ids is missing: the server ignored return_token_ids")
    ids = _ints(choice["token_ids"], "choices[0].token_ids")
    logprobs = _floats(_get(choice, "logprobs", "token_logprobs"), "choices[0].logprobs.token_logprobs")
    finish = _get(choice, "finish_reason")
    if finish not in ("stop", "length"):
        raise MalformedResponse(f"finish_reason {finish!r} (expected stop or length)")
    stop_token = None
    reason = choice.get("stop_reason") if isinstance(choice, dict) else None
    if finish == "stop" and not isinstance(reason, str):
        if not ids:
            raise MalformedResponse("finish_reason stop on a turn with no tokens")
        if isinstance(reason, int) and reason != ids[-1]:
            raise MalformedResponse(f"stop_reason {reason} is not the last token {ids[-1]}")
        stop_token = ids[-1]  # a stop token id, or the model's EOS (stop_reason null)
    version = _version(body.get("policy_version")) if isinstance(body, dict) else None
    return ServerTurn(ids, logprobs, finish, stop_token, version)


def _parse_sglang(body: Any) -> ServerTurn:
    meta = _get(body, "meta_info")
    rows = _get(meta, "output_token_logprobs")
    if not isinstance(rows, list) or not all(isinstance(r, (list, tuple)) and len(r) >= 2 for r in rows):
        raise MalformedResponse("meta_info.output_token_logprobs is not a list of [logprob, token_id, ...]")
    logprobs = _floats([r[0] for r in rows], "meta_info.output_token_logprobs logprobs")
    row_ids = _ints([r[1] for r in rows], "meta_info.output_token_logprobs token ids")
    ids = _ints(_get(body, "output_ids"), "output_ids")
    reason = _get(meta, "finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else None
    if kind not in ("stop", "length"):
        raise MalformedResponse(f"finish_reason {reason!r} (expected type stop or length)")
    matched = reason.get("matched")
    if ids != row_ids:
        # A server that trimmed the stop token from output_ids still lists it with its logprob.
        if not (kind == "stop" and isinstance(matched, int) and ids == row_ids[:-1] and row_ids[-1:] == [matched]):
            raise MalformedResponse("output_ids do not match the token ids of meta_info.output_token_logprobs")
        ids = row_ids
    stop_token = None
    if kind == "stop" and isinstance(matched, int) and not isinstance(matched, bool):
        if not ids or ids[-1] != matched:
            raise MalformedResponse(f"finish_reason matched {matched} is not the last token")
        stop_token = matched
    return ServerTurn(ids, logprobs, kind, stop_token, _version(meta.get("weight_version")))
