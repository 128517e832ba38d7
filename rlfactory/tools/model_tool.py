"""Another language model as a tool: an OpenAI-compatible endpoint, or a local transformers model.

The model sees a chat: an optional system prompt, then the user turn made from the call's
arguments with `prompt_template` (default: the `prompt` argument as is). `complete()` is the same
model as a plain async function, which is what `AgentTool` workflows take.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Literal

import httpx

from rlfactory.tools.base import ERROR, INVALID_ARGUMENTS, ToolResult, TransportError

_DEFAULT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "What to ask the model."}},
    "required": ["prompt"],
}

Messages = list[dict[str, str]]


class ModelTool:
    """A model behind the `Tool` protocol.

    Either `base_url` (OpenAI-compatible server such as vLLM/SGLang/OpenAI: `{base_url}/chat/completions`
    or, with `api="completions"`, `{base_url}/completions`) with the served `model` name, or
    `hf_model` + `tokenizer` (a loaded transformers causal LM and its tokenizer; generation runs in
    a worker thread, one at a time).
    """

    def __init__(
        self,
        name: str = "ask_model",
        description: str = "Ask another language model; returns its answer.",
        *,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        api: Literal["chat", "completions"] = "chat",
        hf_model: Any = None,
        tokenizer: Any = None,
        system_prompt: str | None = None,
        prompt_template: str = "{prompt}",
        parameters: dict[str, Any] | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        request_timeout_s: float = 120.0,
        timeout_s: float | None = None,
        cache: bool | None = False,
        max_concurrency: int | None = None,
    ) -> None:
        if (base_url is None) == (hf_model is None):
            raise ValueError("ModelTool needs exactly one of base_url (an endpoint) or hf_model (+ tokenizer)")
        if hf_model is not None and tokenizer is None:
            raise ValueError("ModelTool with hf_model needs its tokenizer")
        self.name = name
        self.description = description
        self.parameters = parameters or dict(_DEFAULT_PARAMETERS)
        self.base_url = base_url.rstrip("/") if base_url else None
        self.model = model
        self.api_key = api_key
        self.api = api
        self.hf_model = hf_model
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.prompt_template = prompt_template
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.request_timeout_s = request_timeout_s
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.cache = cache
        self._client: httpx.AsyncClient | None = None
        self._generate_lock = threading.Lock()

    async def call(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            prompt = self.prompt_template.format(**arguments)
        except (KeyError, IndexError, ValueError) as e:
            return ToolResult.error(f"{self.name}: cannot build the prompt from the arguments: {e!r}", INVALID_ARGUMENTS)
        try:
            text = await self.complete(prompt)
        except TransportError:
            raise
        except _EndpointError as e:
            return ToolResult.error(f"{self.name}: {e}", ERROR)
        return ToolResult(text=text)

    async def complete(self, prompt: str | Messages) -> str:
        """The model's answer to a prompt (or a list of chat messages)."""
        messages = self._messages(prompt)
        if self.base_url is not None:
            return await self._complete_remote(messages)
        return await asyncio.to_thread(self._complete_local, messages)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _messages(self, prompt: str | Messages) -> Messages:
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if self.system_prompt and not any(m.get("role") == "system" for m in prompt):
            prompt = [{"role": "system", "content": self.system_prompt}, *prompt]
        return list(prompt)

    # ---- OpenAI-compatible endpoint -------------------------------------------------------
    async def _complete_remote(self, messages: Messages) -> str:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(timeout=self.request_timeout_s, headers=headers)
        body: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.model:
            body["model"] = self.model
        if self.api == "chat":
            url, body["messages"] = f"{self.base_url}/chat/completions", messages
        else:
            url, body["prompt"] = f"{self.base_url}/completions", _plain_prompt(messages)
        try:
            resp = await self._client.post(url, json=body)
        except httpx.TransportError as e:
            raise TransportError(f"{self.name}: cannot reach {url}: {type(e).__name__}: {e}") from e
        if resp.status_code == 429 or resp.status_code >= 500:
            raise TransportError(f"{self.name}: {url} answered HTTP {resp.status_code}: {resp.text[:300]}")
        if resp.status_code >= 400:
            raise _EndpointError(f"{url} answered HTTP {resp.status_code}: {resp.text[:500]}")
        try:
            choice = resp.json()["choices"][0]
            text = choice["message"]["content"] if self.api == "chat" else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise _EndpointError(f"{url} gave an answer in an unexpected shape ({e!r}): {resp.text[:300]}") from None
        return text or ""

    # ---- local transformers model ---------------------------------------------------------
    def _complete_local(self, messages: Messages) -> str:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            text = _plain_prompt(messages)
        enc = tok(text, return_tensors="pt")
        device = getattr(self.hf_model, "device", None)
        if device is not None:
            enc = {k: v.to(device) for k, v in enc.items()}
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        sample = self.temperature > 0
        with self._generate_lock:
            out = self.hf_model.generate(
                **enc,
                max_new_tokens=self.max_tokens,
                do_sample=sample,
                temperature=self.temperature if sample else None,
                top_p=None,
                top_k=None,
                pad_token_id=pad,
            )
        new_tokens = out[0, enc["input_ids"].shape[1] :]
        return tok.decode(new_tokens, skip_special_tokens=True)


class _EndpointError(Exception):
    """The endpoint understood us and said no (HTTP 4xx, malformed answer): the tool's own error."""


def _plain_prompt(messages: Messages) -> str:
    return "\n\n".join(m["content"] for m in messages) + "\n"
