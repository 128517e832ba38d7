"""Model-as-judge rewards: a judge model reads (question, model answer, reference) and says a score.

The judge is a local transformers model (`LocalJudge`) or an OpenAI-compatible chat-completions
endpoint (`OpenAIJudge`); both implement `Judge.complete(prompts) -> replies`. `JudgeReward`
renders the prompt template, batches calls (concurrent `score()` calls are coalesced; `score_many`
sends everything at once, `batch_size` prompts per judge call), parses the reply into a score and
caches verdicts in memory keyed by the prompt.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import httpx

from rlfactory.rewards.base import RewardScore, require_scorable
from rlfactory.rewards.text import AnswerExtractor, question_of, references_of, tagged_answer
from rlfactory.text import valid_text
from rlfactory.trajectory import Trajectory

DEFAULT_TEMPLATE = """You are grading an answer to a question against a reference answer.

Question: {question}
Reference answer: {reference}
Model answer: {answer}

Is the model answer correct? Reply with just "yes" or "no"."""
"""Fields: {question}, {answer} (extracted, or "(no answer)"), {reference} (references joined by
" | "), {completion} (all the model's text). Literal braces must be doubled."""

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


class JudgeError(RuntimeError):
    """The judge could not be reached or answered with an error (an infra problem, not a score)."""


class Judge(Protocol):
    async def complete(self, prompts: list[str]) -> list[str]:
        """One reply text per prompt, in order."""
        ...


def parse_yes_no(reply: str) -> float | None:
    """1.0 for a reply whose first yes/no word is "yes", 0.0 for "no", None for neither (after <think>)."""
    m = re.search(r"\b(yes|no|correct|incorrect)\b", _THINK.sub("", reply), re.IGNORECASE)
    if not m:
        return None
    return 1.0 if m.group(1).lower() in ("yes", "correct") else 0.0


def number_score(max_score: float = 10.0, pattern: str = r"(-?\d+(?:\.\d+)?)") -> Callable[[str], float | None]:
    """Parser: the first match of `pattern` (group 1 if any) divided by `max_score`, clamped to [0, 1]."""
    regex = re.compile(pattern)

    def parse(reply: str) -> float | None:
        m = regex.search(_THINK.sub("", reply))
        if not m:
            return None
        try:
            value = float(m.group(1) if m.groups() else m.group(0))
        except ValueError:
            return None
        return min(1.0, max(0.0, value / max_score))

    return parse


# --- judges --------------------------------------------------------------------------------------


class OpenAIJudge:
    """A judge behind an OpenAI-compatible `POST {base_url}/chat/completions` (vLLM, SGLang, OpenAI).

    `api_key` falls back to the environment variable `api_key_env`. Retries transport errors,
    429 and 5xx `retries` times with backoff; other failures raise `JudgeError`. At most
    `max_concurrency` requests are in flight at once. `requests` counts completed requests.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        system: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 64,
        timeout_s: float = 60.0,
        retries: int = 2,
        max_concurrency: int = 8,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key or (os.environ.get(api_key_env) if api_key_env else None)
        self.system = system
        self.temperature, self.max_tokens = temperature, max_tokens
        self.timeout_s, self.retries, self.max_concurrency = timeout_s, retries, max_concurrency
        self.extra_body = dict(extra_body or {})
        self.requests = 0
        self._sems: dict[int, asyncio.Semaphore] = {}

    def _semaphore(self) -> asyncio.Semaphore:
        loop_id = id(asyncio.get_running_loop())
        if loop_id not in self._sems:
            self._sems = {loop_id: asyncio.Semaphore(self.max_concurrency)}
        return self._sems[loop_id]

    async def complete(self, prompts: list[str]) -> list[str]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        sem = self._semaphore()
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=headers) as client:
            return list(await asyncio.gather(*(self._one(client, sem, p) for p in prompts)))

    async def _one(self, client: httpx.AsyncClient, sem: asyncio.Semaphore, prompt: str) -> str:
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + [
            {"role": "user", "content": prompt}
        ]
        body = {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens, **self.extra_body}
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                async with sem:
                    resp = await client.post(self.url, json=body)
            except httpx.TransportError as e:
                if last:
                    raise JudgeError(f"judge at {self.url} unreachable: {e!r}") from e
            else:
                if resp.status_code == 429 or resp.status_code >= 500:
                    if last:
                        raise JudgeError(f"judge at {self.url} answered {resp.status_code}: {resp.text[:200]}")
                elif resp.status_code >= 400:
                    raise JudgeError(f"judge at {self.url} answered {resp.status_code}: {resp.text[:200]}")
                else:
                    try:  # .text reads bytes that are not UTF-8 as U+FFFD (.json() would raise)
                        content = json.loads(resp.text)["choices"][0]["message"].get("content")
                    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as e:
                        raise JudgeError(f"judge at {self.url} sent an unexpected body: {resp.text[:200]}") from e
                    self.requests += 1
                    return content or ""
            await asyncio.sleep(0.25 * 2**attempt)
        raise AssertionError("unreachable")


class LocalJudge:
    """A judge from a local transformers causal LM and its tokenizer (greedy decoding).

    The chat template is used when the tokenizer has one (`use_chat_template=None`), else the
    system text and prompt are joined as plain text. Generation runs in a worker thread (one at a
    time per judge), `batch_size` prompts per `generate`. `requests` counts prompts generated for,
    `generate_calls` the calls to `model.generate`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        system: str | None = None,
        max_new_tokens: int = 32,
        batch_size: int = 8,
        use_chat_template: bool | None = None,
    ) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.system, self.max_new_tokens, self.batch_size = system, max_new_tokens, batch_size
        self.use_chat_template = bool(tokenizer.chat_template) if use_chat_template is None else use_chat_template
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.requests = 0
        self.generate_calls = 0
        self._lock = threading.Lock()

    def render(self, prompt: str) -> str:
        """The exact text fed to the model for `prompt`."""
        if self.use_chat_template:
            messages = ([{"role": "system", "content": self.system}] if self.system else []) + [
                {"role": "user", "content": prompt}
            ]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return f"{self.system}\n\n{prompt}" if self.system else prompt

    async def complete(self, prompts: list[str]) -> list[str]:
        return await asyncio.to_thread(self._generate, list(prompts))

    def _generate(self, prompts: list[str]) -> list[str]:
        import torch

        replies: list[str] = []
        with self._lock, torch.inference_mode():
            for start in range(0, len(prompts), self.batch_size):
                texts = [self.render(p) for p in prompts[start : start + self.batch_size]]
                enc = self.tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
                enc = {k: v.to(self.model.device) for k, v in enc.items()}
                out = self.model.generate(
                    **enc,
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    pad_token_id=self.tokenizer.pad_token_id,
                )
                self.generate_calls += 1
                new = out[:, enc["input_ids"].shape[1] :]
                replies.extend(self.tokenizer.batch_decode(new, skip_special_tokens=True))
                self.requests += len(texts)
        return replies


# --- the reward ----------------------------------------------------------------------------------


@dataclass
class JudgeVerdict:
    reply: str
    score: float | None  # None: the reply could not be parsed


class JudgeReward:
    """Score = the judge's parsed verdict (or `fallback` when unparseable).

    Terms: `score` (the value used) and `parsed` (1.0 when the reply was parsed). `on_error`:
    "raise" (default: a `JudgeError` reaches the caller, which should treat the trajectory as an
    infra error) or "fallback" (score `fallback`, `parsed` 0, nothing cached).
    """

    def __init__(
        self,
        judge: Judge,
        template: str = DEFAULT_TEMPLATE,
        parse: Callable[[str], float | None] = parse_yes_no,
        *,
        answer_extractor: AnswerExtractor | None = None,
        references: Callable[[Trajectory], list[str]] = references_of,
        question: Callable[[Trajectory], str] = question_of,
        batch_size: int = 8,
        fallback: float = 0.0,
        on_error: str = "raise",
    ) -> None:
        if on_error not in ("raise", "fallback"):
            raise ValueError(f"on_error must be 'raise' or 'fallback', got {on_error!r}")
        self.judge, self.template, self.parse = judge, template, parse
        self.answer_extractor = answer_extractor or tagged_answer("answer")
        self.references, self.question = references, question
        self.batch_size, self.fallback, self.on_error = max(1, batch_size), fallback, on_error
        self.cache: dict[str, JudgeVerdict] = {}
        self.cache_hits = 0
        self._inflight: dict[str, asyncio.Future] = {}
        self._pending: list[tuple[str, asyncio.Future]] = []
        self._collecting = False
        self._tasks: set[asyncio.Task] = set()  # strong references to running flushes

    def build_prompt(self, trajectory: Trajectory) -> str:
        answer = self.answer_extractor(trajectory)
        fields = {
            "question": self.question(trajectory),
            "answer": answer if answer is not None else "(no answer)",
            "reference": " | ".join(self.references(trajectory)),
            "completion": trajectory.model_text(),
        }
        return self.template.format_map(fields)

    def _to_score(self, verdict: JudgeVerdict) -> RewardScore:
        value = self.fallback if verdict.score is None else verdict.score
        return RewardScore(total=value, terms={"score": value, "parsed": float(verdict.score is not None)})

    async def verdicts(self, prompts: list[str]) -> list[JudgeVerdict]:
        """The verdict on each prompt (cached, coalesced with identical calls in flight); what
        `JudgeTurnReward` asks about each turn."""
        return await self._verdicts(prompts)

    async def _verdicts(self, prompts: list[str]) -> list[JudgeVerdict]:
        """Verdicts for `prompts`, from the cache, an identical call in flight, or new judge calls."""
        loop = asyncio.get_running_loop()
        new: list[str] = []
        for p in dict.fromkeys(prompts):
            if p in self.cache:
                self.cache_hits += 1
            elif p not in self._inflight:
                self._inflight[p] = loop.create_future()
                new.append(p)
        chunks = [new[i : i + self.batch_size] for i in range(0, len(new), self.batch_size)]
        waiting = {p: self._inflight[p] for p in dict.fromkeys(prompts) if p in self._inflight}
        await asyncio.gather(*(self._send(chunk) for chunk in chunks))
        out = []
        for p in prompts:
            if p in self.cache:
                out.append(self.cache[p])
                continue
            try:
                out.append(await waiting[p])
            except Exception as e:  # a failed judge call
                if self.on_error == "raise":
                    raise
                out.append(JudgeVerdict(reply=f"<judge error: {e}>", score=None))
        return out

    async def _send(self, chunk: list[str]) -> None:
        try:
            # Prompts quote rows and model text, replies come from a server: a lone surrogate in
            # either would make a tokenizer or a UTF-8 encoder raise, failing the whole chunk.
            replies = [valid_text(r)[0] for r in await self.judge.complete([valid_text(p)[0] for p in chunk])]
            if len(replies) != len(chunk):
                raise JudgeError(f"judge returned {len(replies)} replies for {len(chunk)} prompts")
        except Exception as e:
            err = e if isinstance(e, JudgeError) else JudgeError(f"judge failed: {e!r}")
            for p in chunk:
                fut = self._inflight.pop(p)
                fut.set_exception(err)
                fut.exception()  # mark retrieved: callers that gave up must not log warnings
            return
        for p, reply in zip(chunk, replies):
            verdict = JudgeVerdict(reply=reply, score=self.parse(reply))
            self.cache[p] = verdict
            self._inflight.pop(p).set_result(verdict)

    async def score_many(self, trajectories: list[Trajectory]) -> list[RewardScore]:
        for t in trajectories:
            require_scorable(t)
        verdicts = await self._verdicts([self.build_prompt(t) for t in trajectories])
        return [self._to_score(v) for v in verdicts]

    async def score(self, trajectory: Trajectory) -> RewardScore:
        """Scores one trajectory; concurrent calls (e.g. under `asyncio.gather`) share judge batches."""
        require_scorable(trajectory)
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((self.build_prompt(trajectory), fut))
        if not self._collecting:
            self._collecting = True
            task = asyncio.ensure_future(self._flush())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return self._to_score(await fut)

    async def _flush(self) -> None:
        # Wait until one loop turn passes with no new arrival, then send all that came as one batch.
        try:
            while True:
                n = len(self._pending)
                await asyncio.sleep(0)
                if len(self._pending) == n:
                    break
        finally:
            batch, self._pending = self._pending, []
            self._collecting = False  # later arrivals start the next batch
        try:
            verdicts = await self._verdicts([p for p, _ in batch])
        except Exception as e:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), v in zip(batch, verdicts):
            if not fut.done():
                fut.set_result(v)
