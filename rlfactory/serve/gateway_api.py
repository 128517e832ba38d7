"""The OpenAI chat-completions shapes the recording gateway speaks (gateway.py): a request body
into a `ChatRequest` (messages a chat template can render, tool specs, sampling), and a generated
turn back into OpenAI's `chat.completion` object or its `chat.completion.chunk` stream.

What is accepted: `messages` (system, developer, user, assistant with `tool_calls`, tool; content
as a string or a list of text parts), `tools` (function tools), `tool_choice`, `n`,
`temperature`, `top_p`, `max_tokens` / `max_completion_tokens`, `stop`, `seed`, `stream`,
`stream_options.include_usage`. Other fields an SDK sends (`parallel_tool_calls`, `user`,
`metadata`, `store`, ...) are ignored. A field of the wrong type, an image part or an unknown role
is a 400 that names it.

`tool_choice`, as OpenAI and vLLM answer it (vLLM: `none` with `--exclude-tools-when-tool-choice-none`):
  auto      the model sees the tools and may call them (the default).
  none      the tools are not rendered and calls are not parsed: what the model writes is `content`,
            `finish_reason` "stop". (The prompt then differs from one with tools: a new sample of
            the episode starts, gateway_record.py.)
  required  the reply is one or more tool calls; {"type": "function", "function": {"name": f}}: the
            reply calls f (every call is to f). vLLM and OpenAI constrain decoding to that; the
            gateway samples again instead, up to `Gateway.tool_choice_retries` more times, and
            answers with the first reply that complies (the replies it set aside are not
            recorded: the episode trains on what the agent saw). When none does, the call is a 422
            that says so, and the agent's SDK raises it. Without `tools`, or naming a function
            that is not among them, the request is a 400, as with OpenAI.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

from pydantic import ValidationError

from rlfactory.chat.base import Answer, Malformed, ParseResult, ToolCalls
from rlfactory.chat.parsing import split_reasoning
from rlfactory.config import SamplingConfig
from rlfactory.tools.base import ToolSpec

ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_N = 16


class BadRequest(ValueError):
    """The request cannot be served; the message names the field."""


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    """Normalised for a chat template: `developer` -> `system`, content a string, tool-call
    arguments parsed back to objects (a template re-serialises them)."""
    tools: list[ToolSpec]
    n: int = 1
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    tool_choice: str = "auto"
    """auto, none, required, or function (the reply must call `tool_name`)."""
    tool_name: str | None = None


def _number(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"`{name}` must be a number, got {value!r:.80}")
    return float(value)


def _int(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"`{name}` must be an integer, got {value!r:.80}")
    return value


def _text(content: Any, where: str) -> str:
    """A message's content as one string (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                out.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"{where}.content: a part of type {kind!r} is not supported (text parts only)")
        return "".join(out)
    raise BadRequest(f"{where}.content must be a string or a list of text parts")


def _arguments(value: Any) -> Any:
    """OpenAI sends arguments as a JSON string; templates want the object (and re-serialise it
    with json.dumps' separators, which is how rlfactory's families write calls). A string that is
    not a JSON object stays a string (the template then shows it as it is)."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return value
        return parsed if isinstance(parsed, dict) else value
    return value


def _message(msg: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise BadRequest(f"{where} must be an object")
    role = msg.get("role")
    if role not in ROLES:
        raise BadRequest(f"{where}.role must be one of {sorted(ROLES)}, got {role!r:.40}")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role,
                           "content": _text(msg.get("content"), where)}
    if role == "assistant":
        calls = msg.get("tool_calls") or []
        if not isinstance(calls, list):
            raise BadRequest(f"{where}.tool_calls must be a list")
        norm = []
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest(f"{where}.tool_calls[{j}] must be {{type: function, function: {{name, arguments}}}}")
            norm.append({"id": call.get("id"), "type": "function",
                         "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments", "{}"))}})
        if norm:
            out["tool_calls"] = norm
        if isinstance(msg.get("reasoning_content"), str):
            out["reasoning_content"] = msg["reasoning_content"]
    elif role == "tool":
        for key in ("tool_call_id", "name"):
            if isinstance(msg.get(key), str):
                out[key] = msg[key]
    return out


def _tools(value: Any) -> list[ToolSpec]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest("`tools` must be a list")
    specs = []
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise BadRequest(f"tools[{i}] must be a function tool {{type: function, function: {{name, ...}}}}")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise BadRequest(f"tools[{i}].function.parameters must be a JSON schema object")
        specs.append(ToolSpec(fn["name"], str(fn.get("description") or ""), params))
    return specs


def parse_chat(body: Any) -> ChatRequest:
    """The request `body` (parsed JSON) as a ChatRequest; BadRequest naming the field otherwise."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("`messages` must be a non-empty list")
    n = _int(body, "n")
    n = 1 if n is None else n
    if not 1 <= n <= MAX_N:
        raise BadRequest(f"`n` must be between 1 and {MAX_N}")
    max_tokens = _int(body, "max_completion_tokens")
    max_tokens = max_tokens if max_tokens is not None else _int(body, "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest("`max_tokens` must be >= 1")
    temperature = _number(body, "temperature", 1.0)
    try:
        sampling = SamplingConfig(temperature=max(temperature, 0.0), top_p=_number(body, "top_p", 1.0),
                                  greedy=temperature <= 0)
    except ValidationError as e:
        raise BadRequest("; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())) from None
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest("`stop` must be a string or a list of strings")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequest("`stream` must be true or false")
    options = body.get("stream_options") or {}
    tools = _tools(body.get("tools"))
    choice, name = _tool_choice(body.get("tool_choice"), tools)
    return ChatRequest([_message(m, i) for i, m in enumerate(messages)], tools, n, sampling,
                       max_tokens, [s for s in stops if s], _int(body, "seed"), bool(stream),
                       bool(isinstance(options, dict) and options.get("include_usage")), choice, name)


def _tool_choice(value: Any, tools: list[ToolSpec]) -> tuple[str, str | None]:
    """(auto | none | required | function, the function's name); BadRequest as OpenAI answers."""
    if value in (None, "auto", "none"):
        return value or "auto", None
    if value == "required":
        if not tools:
            raise BadRequest("`tool_choice` is required but the request has no `tools`")
        return "required", None
    fn = value.get("function") if isinstance(value, dict) and value.get("type", "function") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRequest("`tool_choice` must be auto, none, required or {type: function, function: {name}}")
    names = [t.name for t in tools]
    if fn["name"] not in names:
        raise BadRequest(f"`tool_choice` names function {fn['name'][:100]!r}, which is not in `tools` "
                         f"({', '.join(names) or 'none given'})")
    return "function", fn["name"]


def unmet_tool_choice(request: ChatRequest, parsed: ParseResult) -> str | None:
    """Why the turn `parsed` does not do what `request.tool_choice` asks (None when it does)."""
    if request.tool_choice not in ("required", "function"):
        return None
    calls = parsed.calls if isinstance(parsed, ToolCalls) else []
    if not calls:
        return (f"the model wrote a malformed call ({parsed.reason[:200]})" if isinstance(parsed, Malformed)
                else "the model wrote no tool call")
    other = next((c.name for c in calls if c.name != request.tool_name), None)
    if request.tool_choice == "function" and other is not None:
        return f"the model called {other[:100]!r}, not {request.tool_name!r}"
    return None


# ---- the reply ----------------------------------------------------------------------------------

@dataclass
class Choice:
    """One generated turn as the agent sees it."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    reasoning: str | None = None
    completion_tokens: int = 0


def make_choice(text: str, parsed: ParseResult, length: bool, tool_choice: Any, n_tokens: int) -> Choice:
    """`text` (the turn without its stop token) and what the family parsed it as, in OpenAI's shape:
    calls become `tool_calls` (ids fresh, arguments a JSON string), thinking `reasoning_content`."""
    reasoning, visible = split_reasoning(text)
    calls: list[dict[str, Any]] = []
    content: str | None = visible
    if isinstance(parsed, ToolCalls) and parsed.calls and tool_choice != "none":
        calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                  "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                 for c in parsed.calls]
        content = parsed.text or None
    elif isinstance(parsed, (Answer, Malformed)):
        content = visible
    finish = "length" if length else "tool_calls" if calls else "stop"
    return Choice(content, calls, finish, reasoning or None, n_tokens)


def _message_of(choice: Choice) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": choice.content, "refusal": None}
    if choice.tool_calls:
        msg["tool_calls"] = choice.tool_calls
    if choice.reasoning is not None:
        msg["reasoning_content"] = choice.reasoning
    return msg


def completion(choices: list[Choice], model: str, prompt_tokens: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The `chat.completion` object; `extra` (rlfactory's episode/sample/version) rides along."""
    used = sum(c.completion_tokens for c in choices)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "system_fingerprint": None,
            "choices": [{"index": i, "message": _message_of(c), "finish_reason": c.finish_reason, "logprobs": None}
                        for i, c in enumerate(choices)],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": used, "total_tokens": prompt_tokens + used},
            "rlfactory": extra}


def stream_chunks(choices: list[Choice], model: str, prompt_tokens: int, include_usage: bool) -> Iterator[str]:
    """The same reply as server-sent events of `chat.completion.chunk` objects, then `[DONE]`: per
    choice a role chunk, its content, each tool call whole (id, name, arguments), the finish."""
    ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def event(choice: dict[str, Any] | None, usage: dict[str, Any] | None = None) -> str:
        chunk = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                 "system_fingerprint": None, "choices": [choice] if choice is not None else []}
        if usage is not None or include_usage:
            chunk["usage"] = usage
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    for i, c in enumerate(choices):
        yield event({"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                     "logprobs": None})
        if c.reasoning is not None:
            yield event({"index": i, "delta": {"reasoning_content": c.reasoning}, "finish_reason": None,
                         "logprobs": None})
        if c.content:
            yield event({"index": i, "delta": {"content": c.content}, "finish_reason": None, "logprobs": None})
        for k, call in enumerate(c.tool_calls):
            delta = {"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                     "function": dict(call["function"])}]}
            yield event({"index": i, "delta": delta, "finish_reason": None, "logprobs": None})
        yield event({"index": i, "delta": {}, "finish_reason": c.finish_reason, "logprobs": None})
    if include_usage:
        used = sum(c.completion_tokens for c in choices)
        yield event(None, {"prompt_tokens": prompt_tokens, "completion_tokens": used,
                           "total_tokens": prompt_tokens + used})
    yield "data: [DONE]\n\n"


def error_body(message: str, status: int) -> dict[str, Any]:
    kinds = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             422: "unprocessable_entity_error"}
    kind = kinds.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}
