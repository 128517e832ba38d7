"""The `bfcl_multi_turn` env rolled out by the real engine with the real qwen3 ToolManager (rlfactory's
tiny tokenizer) and a scripted generator: BFCL's user turns come after each answer, the calls run on
BFCL's own backends (one set per trajectory), and BFCL's state and response checkers score the end.
The ground truth passes in every multi-turn category and a wrong model fails."""

from __future__ import annotations

import ast
import asyncio
import json

import pytest

pytest.importorskip("bfcl_eval")

from transformers import AutoTokenizer  # noqa: E402

from rlfactory.chat import make_tool_manager  # noqa: E402
from rlfactory.config import RolloutConfig, SamplingConfig  # noqa: E402
from rlfactory.envs.bfcl.multi_turn_env import MULTI_TURN_CATEGORIES, BfclMultiTurnEnv, calls_per_turn  # noqa: E402
from rlfactory.envs.bfcl.package import bfcl  # noqa: E402
from rlfactory.envs.registry import make_env  # noqa: E402
from rlfactory.protocols import GenRequest, GenResult  # noqa: E402
from rlfactory.rollout.engine import RolloutEngine  # noqa: E402
from rlfactory.tiny import resolve_model  # noqa: E402

PER_CATEGORY = 2
USER = "<|im_start|>user\n"


def parse_call(text: str, functions: list[dict]) -> tuple[str, dict]:
    """`f(a=1, b='x')` (BFCL's ground-truth call string; a few pass arguments by position) as
    (name, arguments), positions named after the function's parameters in order."""
    node = ast.parse(text, mode="eval").body
    params = next(list(f["parameters"]["properties"]) for f in functions if f["name"] == node.func.id)
    args = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    return node.func.id, {**args, **{k.arg: ast.literal_eval(k.value) for k in node.keywords}}


def tool_call(name: str, args: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


class Scripted:
    """Answers each request from its context: per BFCL turn, the ground truth's calls one per model
    turn, then "Done."; `wrong` gives `wrong(turn calls)` instead of them."""

    def __init__(self, tokenizer, rows, wrong=None) -> None:
        self.tok = tokenizer
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.truth = {r["question"]: r["ground_truth"] for r in rows}
        self.functions = {r["question"]: r["functions"] + [f for fs in (r["entry"].get("missed_function") or {}).values()
                                                           for f in fs] for r in rows}
        self.wrong = wrong
        self.contexts: list[str] = []

    def plan(self, ctx: str) -> str:
        question = max((q for q in self.truth if q in ctx), key=len)
        parts = ctx.split(USER)[1:]
        asked = [p for p in parts if not p.startswith("<tool_response>")]
        turn = len(asked) - 1
        done = sum(p.count("<tool_response>") for p in parts[parts.index(asked[-1]) + 1:])
        calls = [parse_call(c, self.functions[question]) for c in self.truth[question][turn]]
        if self.wrong is not None:
            calls = self.wrong(calls)
        return tool_call(*calls[done]) if done < len(calls) else "Done."

    async def submit(self, req: GenRequest) -> GenResult:
        await asyncio.sleep(0)
        ctx = self.tok.decode(req.prompt_ids)
        self.contexts.append(ctx)
        ids = self.tok.encode(self.plan(ctx), add_special_tokens=False) + [self.eot]
        return GenResult(ids, [0.0] * len(ids), "stop", self.tok.decode(ids), self.eot)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))


@pytest.fixture(scope="module")
def rows():
    return BfclMultiTurnEnv(limit=PER_CATEGORY).load_split("test")


def roll(tok, env, rows, gen, n=1, **rollout):
    tm = make_tool_manager(tok, "qwen3", enable_thinking=False)
    limits = {"max_total_tokens": 40000, "max_new_tokens": 400, "max_observation_tokens": 4096, **rollout}
    engine = RolloutEngine(gen, tm, None, env, RolloutConfig(**limits), SamplingConfig(), tokenizer=tok)
    trajs = asyncio.run(engine.run(rows, n))
    scores = [asyncio.run(env.reward().score(t)) for t in trajs]
    return trajs, scores


def test_ground_truth_passes_every_multi_turn_category_and_no_calls_fail(tok, rows):
    assert [r["category"] for r in rows] == [c for c in MULTI_TURN_CATEGORIES for _ in range(PER_CATEGORY)]
    env = BfclMultiTurnEnv(limit=PER_CATEGORY)
    # One run per category: the categories' entries share their first questions.
    runs = [roll(tok, env, rows[k:k + PER_CATEGORY], Scripted(tok, rows[k:k + PER_CATEGORY]))
            for k in range(0, len(rows), PER_CATEGORY)]
    trajs = [t for ts, _ in runs for t in ts]
    scores = [s for _, ss in runs for s in ss]
    for row, t, s in zip(rows, trajs, scores):
        assert t.status == "ok", (row["id"], t.status, t.error)
        assert s.terms == {"correct": 1.0}, (row["id"], t.tool_calls[-3:])
        assert t.metrics["user_turns"] == len(row["turns"]) - 1
        assert [len(turn) for turn in calls_per_turn(t)] == [len(turn) for turn in row["ground_truth"]]
        user_turns = [s.text for s in t.segments[1:] if s.role == "observation" and "<tool_response>" not in s.text]
        assert len(user_turns) == len(row["turns"]) - 1
        assert all(not s.logprobs for s in t.segments if s.role == "observation")
    for k in range(0, len(rows), PER_CATEGORY):
        trajs, scores = roll(tok, env, rows[k:k + PER_CATEGORY], Scripted(tok, rows[k:k + PER_CATEGORY], wrong=lambda calls: []))
        assert [s.terms["correct"] for s in scores] == [0.0] * PER_CATEGORY
        assert all(t.status == "ok" for t in trajs)


def test_the_held_out_function_is_offered_at_the_turn_bfcl_names(tok, rows):
    row = next(r for r in rows if r["category"] == "multi_turn_miss_func")
    (turn, missed), = row["entry"]["missed_function"].items()
    assert missed[0]["name"] not in {f["name"] for f in row["functions"]}  # held out of the prompt
    gen = Scripted(tok, [row])
    trajs, scores = roll(tok, BfclMultiTurnEnv(), [row], gen)
    assert scores[0].terms["correct"] == 1.0
    user_turns = [s.text for s in trajs[0].segments if s.role == "observation" and "<tool_response>" not in s.text]
    offered = user_turns[int(turn) - 1]
    assert f'"name": "{missed[0]["name"]}"' in offered
    assert "I have updated some more functions you can choose from. What about now?" in offered
    assert f'"name": "{missed[0]["name"]}"' not in trajs[0].segments[0].text


def test_each_sample_has_its_own_backends_and_they_are_removed_at_the_end(tok, rows):
    # Two samples of one entry at once: shared instances would move the file twice, and the second
    # sample's results would not be BFCL's.
    row = rows[0]
    space = vars(bfcl().multi_turn)["execute_multi_turn_func_call"].__globals__
    before = set(space)
    trajs, scores = roll(tok, BfclMultiTurnEnv(), [row], Scripted(tok, [row]), n=3)
    assert [s.terms["correct"] for s in scores] == [1.0] * 3
    assert set(space) - before == set()


def test_calls_outside_the_entrys_functions_are_refused_not_run(tok, rows):
    row = rows[0]
    evil = [("__import__('os').system", {"command": "touch /tmp/x"}), ("cd", {"folder=__import__('os')": 1}),
            ("cd", {"folder": "document"})]
    gen = Scripted(tok, [row], wrong=lambda calls: evil if calls and calls[0][0] == "cd" else calls)
    trajs, _ = roll(tok, BfclMultiTurnEnv(), [row], gen)
    first = trajs[0].tool_calls[:3]
    assert [(c.status, c.error) for c in first[:2]] == [
        ("error", "no function named \"__import__('os').system\" here"),
        ("error", "cd: \"folder=__import__('os')\" is not an argument name")]
    assert first[2].status == "ok"
    assert "document" in trajs[0].segments[6].text  # the cd ran on the entry's file system


def test_a_turn_past_bfcls_step_limit_ends_the_trajectory(tok, rows):
    row = rows[0]
    gen = Scripted(tok, [row], wrong=lambda calls: [("pwd", {})] * 5)
    trajs, scores = roll(tok, BfclMultiTurnEnv(steps_per_turn=3), [row], gen)
    assert trajs[0].status == "truncated" and "more than 3 steps" in trajs[0].error
    assert trajs[0].turns == 4 and scores[0].terms["correct"] == 0.0


def test_built_in_name_splits_and_options():
    env = make_env("bfcl_multi_turn", test_categories="base,miss_param", limit=1)
    assert [r["category"] for r in env.load_split("test")] == ["multi_turn_base", "multi_turn_miss_param"]
    assert env.load_split("train") == []
    assert [r["id"] for r in env.load_split("long_context")] == ["multi_turn_long_context_0"]
    with pytest.raises(ValueError, match="'nope' is not a multi-turn category; choose from multi_turn_base"):
        BfclMultiTurnEnv(test_categories="nope")
    with pytest.raises(ValueError, match="only prompt_style 'tools'"):
        BfclMultiTurnEnv(prompt_style="bfcl")
    with pytest.raises(TypeError, match="unknown option"):
        BfclMultiTurnEnv(shaping=1.0)
