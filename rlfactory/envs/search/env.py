"""The search env (the Search-R1 experiment): questions answered by searching a corpus through an
MCP `search` tool backed by a BM25 retriever server with Search-R1's HTTP API.

Data: by default a generated knowledge world (rlfactory.envs.search.world) written to
`data_dir` (or a temp dir): corpus.jsonl, train.parquet, test.parquet. Or bring your own
Search-R1 files: `train_data` / `test_data` parquet and a `corpus` JSON-lines file (or the URL of
a running retriever, e.g. Search-R1's own e5 server, as `retriever_url`).

The env starts the retriever itself when it has no URL (free port, waits for readiness) and stops
it on `close()` (also at exit, and the server exits if this process dies).
Reward: exact match with Search-R1's normalisation (0.9) + format (0.1).
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import weakref
from typing import Any

from rlfactory.envs.base import Env, EnvTools
from rlfactory.envs.data import question_of, read_parquet, targets
from rlfactory.envs.registry import register_env
from rlfactory.envs.search.mcp_server import search_sync
from rlfactory.envs.search.prompts import opening_messages
from rlfactory.envs.search.service import RetrieverProcess
from rlfactory.envs.search.world import WorldFiles, extract_fact, find_fact, make_world, write_world
from rlfactory.rewards.base import Reward
from rlfactory.rewards.rule import RuleReward
from rlfactory.rewards.text import normalize_answer


@register_env("search")
class SearchEnv(Env):
    """Options: `family` ("qwen3"; "searchr1" gives Search-R1's instruction and tag format;
    `searchr1_single_turn` puts it in one user turn exactly as Search-R1 does), `train_data`,
    `test_data`, `corpus`, `retriever_url`, `topk` (3), `max_turns` (4), `system_prompt`; for
    the generated world: `seed` (0), `n_train_entities` (200), `n_test_entities` (50),
    `max_hops` (2), `data_dir` (where to write it; default a temp dir removed on close); for
    demonstrations: `guess_rate` (0.0), the share of rows on which the solver answers without
    searching, with the answer of another train question of the same kind (what a model without
    the tool can do), so that a warm start imitates a policy that searches only some of the time
    (`learn_guesses` (true): false marks each guess, so that SFT learns to answer at once but not
    the guessed value: Env.solve);
    `counterfactual_rate` (0.0), for the generated world: the share of SFT visits of a searched
    demonstration that train on a counterfactual variant, the fact its last search found replaced,
    in that result and in the answer, by another value of the same relation in the train world (a
    birth year by another year, a city by another city), so that the warm start learns to read the
    answer off the result rather than to recall it (each visit draws anew: `augment_demo`)."""

    name = "search"

    def __init__(self, *, family: str | None = "qwen3", train_data: str | None = None, test_data: str | None = None,
                 corpus: str | None = None, retriever_url: str | None = None, topk: int = 3, max_turns: int = 4,
                 system_prompt: str | None = None, searchr1_single_turn: bool = False, seed: int = 0, n_train_entities: int = 200,
                 n_test_entities: int = 50, max_hops: int = 2, data_dir: str | None = None, guess_rate: float = 0.0,
                 counterfactual_rate: float = 0.0, learn_guesses: bool = True, **options: Any) -> None:
        if options:
            raise TypeError(f"search env: unknown option(s) {', '.join(sorted(options))}")
        self.family = family or "qwen3"
        if not 0.0 <= guess_rate <= 1.0:
            raise ValueError(f"search env: guess_rate must be within [0, 1], got {guess_rate}")
        self.guess_rate = guess_rate
        self.learn_guesses = learn_guesses
        if not 0.0 <= counterfactual_rate <= 1.0:
            raise ValueError(f"search env: counterfactual_rate must be within [0, 1], got {counterfactual_rate}")
        self.counterfactual_rate = counterfactual_rate
        self._values: dict[str, list[str]] = {}  # relation -> its values in the train world (counterfactuals)
        self._guesses: dict[tuple[str, ...], list[str]] | None = None
        self.topk, self.max_turns, self.system_prompt = topk, max_turns, system_prompt
        self.searchr1_single_turn = searchr1_single_turn
        self.retriever_url = retriever_url.rstrip("/") if retriever_url else None
        self._retriever: RetrieverProcess | None = None
        self._tmp: str | None = None
        self.files: WorldFiles | None = None
        if train_data or test_data or corpus or retriever_url:
            self.data = {"train": train_data, "test": test_data}
            self.corpus = corpus
        else:  # the generated world
            out = data_dir or tempfile.mkdtemp(prefix="rlfactory-search-")
            self._tmp = None if data_dir else out
            if self._tmp:
                weakref.finalize(self, shutil.rmtree, self._tmp, True)
            world = make_world(seed, n_train_entities, n_test_entities, max_hops=max_hops)
            for entity in world.entities("train"):
                for rel, value in world.facts[entity].items():
                    self._values.setdefault(rel, []).append(value)
            self._values = {rel: sorted(set(v)) for rel, v in self._values.items()}
            self.files = write_world(world, out)
            self.data = {"train": str(self.files.train), "test": str(self.files.test)}
            self.corpus = str(self.files.corpus)

    # -- data ---------------------------------------------------------------------------------

    def load_split(self, split: str) -> list[dict[str, Any]]:
        path = self.data.get(split)
        if not path:
            raise ValueError(f"search env: no {split!r} data (set env.{split}_data)")
        return read_parquet(path)

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return opening_messages(question_of(row), self.family, self.system_prompt, self.searchr1_single_turn)

    # -- tools --------------------------------------------------------------------------------

    def url(self) -> str:
        """The retriever's base URL, starting the retriever process first if needed."""
        if self.retriever_url:
            return self.retriever_url
        if self._retriever is None:
            if not self.corpus:
                raise ValueError("search env: give env.options.corpus (JSON lines) or env.options.retriever_url")
            self._retriever = RetrieverProcess(self.corpus, topk=self.topk).start()
        return self._retriever.url

    def mcp_config(self) -> dict[str, Any]:
        return {"mcpServers": {"search": {
            "command": sys.executable,
            "args": ["-m", "rlfactory.envs.search.mcp_server", "--url", self.url(), "--topk", str(self.topk)],
        }}}

    def tools(self) -> EnvTools:
        return EnvTools(mcp=self.mcp_config())

    def reward(self) -> Reward:
        return RuleReward({"exact_match": 0.9, "format": 0.1})

    # -- demonstrations -----------------------------------------------------------------------

    def solve(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Search one hop at a time, reading each hop's answer off the real search results.

        Generated rows follow their relation chain (`extra_info.subject`, `.relations`): query the
        subject's name, extract the fact from the passages, query the found name, and so on.
        Other rows (e.g. NQ): one search with the question; answered only when a ground-truth
        answer occurs in the results, else ValueError (no demonstration that guesses)."""
        info = row.get("extra_info") or {}
        messages = self.reset(row)
        subject, relations = info.get("subject"), list(info.get("relations") or [])
        guess = self._guess(row, tuple(relations))
        if guess is not None:
            mark = {} if self.learn_guesses else {"guess": guess}  # marked: SFT learns to answer at once, not this value
            messages.append({**self.answer_message(guess), **mark})
            return messages
        if subject and relations:
            entity = subject
            for rel in relations:
                text = self._search(entity, messages)
                found = extract_fact(rel, entity, text)
                if found is None:
                    raise RuntimeError(f"search env solver: no {rel!r} of {entity!r} in the results:\n{text}")
                entity = found
            answer = entity
        else:
            text = normalize_answer(self._search(question_of(row), messages))
            answer = next((t for t in targets(row) if normalize_answer(t) and normalize_answer(t) in text), None)
            if answer is None:
                raise ValueError("search env solver: no ground-truth answer in the search results")
        messages.append(self.answer_message(answer))
        return messages

    def augment_demo(self, row: dict[str, Any], messages: list[dict[str, Any]],
                     rng: random.Random) -> list[dict[str, Any]] | None:
        """With probability `counterfactual_rate`, a counterfactual variant of a searched
        generated-world demonstration: the value its last search's result states for the last
        relation of the row's chain, replaced there and in the answer by another value of that
        relation from the train world. Guesses and rows of brought data stay as written (None)."""
        relations = list((row.get("extra_info") or {}).get("relations") or [])
        if self.counterfactual_rate <= 0.0 or not relations or not self._values:
            return None
        last = max((i for i, m in enumerate(messages) if m["role"] == "tool"), default=None)
        if last is None or rng.random() >= self.counterfactual_rate:
            return None
        rel = relations[-1]
        subject = messages[last - 1]["tool_calls"][0]["function"]["arguments"]["query"]
        text = messages[last]["content"]
        m = find_fact(rel, subject, text)
        pool = self._values.get(rel, [])
        if m is None or len(pool) < 2:
            return None
        value = m.group(1)
        new = value
        while new == value:
            new = rng.choice(pool)
        out = list(messages)
        out[last] = {**messages[last], "content": text[:m.start(1)] + new + text[m.end(1):]}
        out[-1] = self.answer_message(new)
        return out

    def _guess(self, row: dict[str, Any], kind: tuple[str, ...]) -> str | None:
        """For a train row, with probability `guess_rate` (fixed per row), a guessed answer: the
        answer of a random train question of the same kind (the same relations), rarely this row's."""
        if self.guess_rate <= 0.0 or (row.get("extra_info") or {}).get("split", "train") != "train":
            return None
        rng = random.Random(f"guess:{row.get('id')}:{question_of(row)}")
        if rng.random() >= self.guess_rate:
            return None
        if self._guesses is None:
            self._guesses = {}
            for r in self.load_split("train"):
                rels = tuple((r.get("extra_info") or {}).get("relations") or [])
                self._guesses.setdefault(rels, []).extend(targets(r)[:1])
        pool = self._guesses.get(kind) or [a for answers in self._guesses.values() for a in answers]
        return rng.choice(pool) if pool else None

    def answer_message(self, answer: str) -> dict[str, Any]:
        """The final assistant message. Tool-calling families write the tags themselves; the
        `searchr1` ToolManager wraps a turn without calls in `<answer> ... </answer>`."""
        return {"role": "assistant", "content": answer if self.family == "searchr1" else f"<answer>{answer}</answer>"}

    def _search(self, query: str, messages: list[dict[str, Any]]) -> str:
        text = search_sync(self.url(), query, self.topk)
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"query": query}}}]})
        messages.append({"role": "tool", "name": "search", "content": text})
        return text

    def close(self) -> None:
        if self._retriever is not None:
            self._retriever.stop()
            self._retriever = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
