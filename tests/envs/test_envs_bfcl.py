"""The bfcl env's data, decoding and scoring on bfcl-eval's real data: verdicts are the package's
own (ast_checker, its prompting decoder), checked here on possible answers and on wrong ones."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("bfcl_eval")

from rlfactory.chat.base import Answer, Malformed, ToolCalls  # noqa: E402
from rlfactory.envs.bfcl.data import load_category, openai_tools, resolve_categories  # noqa: E402
from rlfactory.envs.bfcl.env import TRAIN_CATEGORIES, BfclEnv, BfclReward, prompting_text  # noqa: E402
from rlfactory.envs.bfcl.score import Decoded, accuracy_summary, answer_calls, check, decode_prompting  # noqa: E402
from rlfactory.envs.bfcl.split import overlap  # noqa: E402
from rlfactory.rollout.engine import row_tool_specs  # noqa: E402
from rlfactory.tools.base import ToolCall, ToolSpec  # noqa: E402
from rlfactory.trajectory import Trajectory  # noqa: E402


UNANSWERABLE = {"live_simple": ["live_simple_106-63-0", "live_simple_112-68-0"]}


@pytest.mark.parametrize("category", ["simple_python", "multiple", "parallel", "live_simple", "live_parallel",
                                      "live_parallel_multiple"])
def test_possible_answers_pass_bfcls_checker_and_a_changed_value_does_not(category):
    rows = load_category(category)
    rejected = [row["id"] for row in rows if not check(row, Decoded(answer_calls(row["ground_truth"]))).valid]
    # two live_simple entries give a required parameter no allowed value ([]): BFCL's checker accepts
    # no answer to them at all (an empty list is a type error there too)
    assert rejected == UNANSWERABLE.get(category, [])
    row = rows[0]
    calls = answer_calls(row["ground_truth"])
    name, args = next(iter(calls[0].items()))
    key = next(iter(args))
    broken = [{name: dict(args, **{key: "certainly not this"})}] + calls[1:]
    verdict = check(row, Decoded(broken))
    assert not verdict.valid and verdict.error_type  # BFCL's own error type, e.g. value_error:string
    assert not check(row, Decoded([{"made_up": {}}] + calls[1:])).valid
    assert not check(row, Decoded(error="SyntaxError: nope")).valid


def test_irrelevance_passes_without_a_call_and_fails_with_one():
    row = load_category("irrelevance", limit=1)[0]
    assert check(row, Decoded([])).valid
    assert check(row, Decoded(error="not a call")).valid  # BFCL: undecodable output is no call
    verdict = check(row, Decoded([{row["functions"][0]["name"]: {}}]))
    assert not verdict.valid and verdict.error_type == "irrelevance_error:decoder_success"


def test_prompting_style_decodes_with_bfcls_decoder():
    row = load_category("parallel", "bfcl", limit=1)[0]
    assert "You are an expert in composing functions" in row["messages"][0]["content"]  # BFCL's system prompt
    assert "tools" not in row
    text = prompting_text(answer_calls(row["ground_truth"]))
    assert decode_prompting(text).calls == answer_calls(row["ground_truth"])
    assert check(row, decode_prompting(text)).valid
    assert decode_prompting("I would rather not.").error


def test_a_truncated_bfcl_style_reply_is_decoded_as_bfcl_would():
    from rlfactory.trajectory import Segment

    row = load_category("simple_python", "bfcl", limit=1)[0]
    for text, valid in [(prompting_text(answer_calls(row["ground_truth"])), True), ("The area is 25 and", False)]:
        traj = Trajectory(id="t", group="g", info=row, turns=1, status="truncated",
                          segments=[Segment("model", [1, 2], text)])
        assert asyncio.run(BfclReward().score(traj)).terms["correct"] == float(valid), text


def test_tools_keep_bfcl_names_and_get_json_schema_types():
    row = load_category("simple_python", limit=2)[1]  # math.factorial: a dotted name
    tools = openai_tools(row["functions"])
    assert tools[0]["function"]["name"] == "math.factorial"
    assert tools[0]["function"]["parameters"]["type"] == "object"  # BFCL's "dict"
    assert row["tools"] == tools
    specs = row_tool_specs(row, [ToolSpec("env_tool", "", {})])
    assert [s.name for s in specs] == ["math.factorial"]
    assert [s.name for s in row_tool_specs({}, [ToolSpec("env_tool", "", {})])] == ["env_tool"]
    with pytest.raises(ValueError, match="not a function with a name"):
        row_tool_specs({"tools": [{"function": {"description": "no name"}}]}, [])
    with pytest.raises(ValueError, match="must be a list"):
        row_tool_specs({"tools": "add"}, [])


def test_categories_resolve_aliases_and_name_the_unknown():
    assert resolve_categories("simple,live,simple") == ["simple_python", "live_simple", "live_multiple",
                                                       "live_parallel", "live_parallel_multiple",
                                                       "live_irrelevance", "live_relevance"]
    with pytest.raises(ValueError, match="'simpel'.*choose from"):
        resolve_categories("simpel")
    with pytest.raises(ValueError, match="a multi-turn category: the bfcl_multi_turn env runs it"):
        resolve_categories(["multi_turn_base"])  # the single-turn env's
    assert resolve_categories("simple,multi_turn", multi_turn=True) == [
        "simple_python", "multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]


def test_env_records_the_turns_calls_and_scores_them():
    env = BfclEnv(limit=1)
    row = env.load_split("simple")[0]
    (name, args), = answer_calls(row["ground_truth"])[0].items()
    for turn, right in [(ToolCalls([ToolCall(name, args)]), 1.0), (ToolCalls([ToolCall(name, {})]), 0.0),
                        (Malformed("bad json"), 0.0), (Answer("no idea"), 0.0)]:
        traj = Trajectory(id="t", group="g", info=env.info(row), turns=1)
        assert env.end_episode(traj, turn) == "ok"
        score = asyncio.run(env.reward().score(traj))
        assert score.terms["correct"] == right and score.total == right, turn
    assert env.max_turns == 1


def test_shaping_terms_give_partial_credit_and_count_in_the_total_by_weight():
    env = BfclEnv(limit=1, shaping=0.5)
    row = env.load_split("simple")[0]  # calculate_triangle_area(base=10, height=5[, unit])
    (name, args), = answer_calls(row["ground_truth"])[0].items()
    cases = [
        (ToolCalls([ToolCall(name, args)]), {"correct": 1.0, "format": 1.0, "name_match": 1.0, "arg_match": 1.0}),
        (ToolCalls([ToolCall(name, {"base": 10})]), {"correct": 0.0, "format": 1.0, "name_match": 1.0,
                                                     "arg_match": 1 / len(args)}),
        (ToolCalls([ToolCall("other", args)]), {"correct": 0.0, "format": 1.0, "name_match": 0.0, "arg_match": 0.0}),
        (Malformed("bad json"), {"correct": 0.0, "format": 0.0, "name_match": 0.0, "arg_match": 0.0}),
    ]
    for turn, want in cases:
        traj = Trajectory(id="t", group="g", info=env.info(row), turns=1)
        env.end_episode(traj, turn)
        score = asyncio.run(env.reward().score(traj))
        assert score.terms == pytest.approx(want), turn
        shaped = want["format"] + want["name_match"] + want["arg_match"]
        assert score.total == pytest.approx(want["correct"] + 0.5 * shaped)
    irrelevant = BfclEnv(limit=1).load_split("irrelevance")[0]
    traj = Trajectory(id="t", group="g", info=irrelevant, turns=1)
    BfclEnv().end_episode(traj, Answer("none fits"))
    assert asyncio.run(BfclReward(1.0).score(traj)).terms == {"correct": 1.0, "format": 1.0, "name_match": 1.0,
                                                              "arg_match": 1.0}


def test_type_match_counts_arguments_of_the_declared_type_and_weighs_on_its_own():
    env = BfclEnv(limit=1, type_shaping=0.5)
    row = env.load_split("simple")[0]  # calculate_triangle_area(base: integer, height: integer, unit: string)
    (name, args), = answer_calls(row["ground_truth"])[0].items()
    assert isinstance(args["base"], int)
    quoted = {k: str(v) if isinstance(v, int) else v for k, v in args.items()}
    n_int = sum(isinstance(v, int) for v in args.values())
    cases = [(ToolCalls([ToolCall(name, args)]), 1.0, 1.0),
             (ToolCalls([ToolCall(name, quoted)]), 0.0, 1 - n_int / len(args)),
             (ToolCalls([ToolCall(name, {"base": True, "height": 5.5})]), 0.0, 0.0),  # a bool is no integer
             (ToolCalls([ToolCall(name, {"base": 10, "nobody_asked": "x"})]), 0.0, 1.0),  # not in the schema: not counted
             (Malformed("bad json"), 0.0, 0.0),
             (Answer("no call where one is expected"), 0.0, 0.0)]  # else not calling earns the term for free
    for turn, correct, typed in cases:
        traj = Trajectory(id="t", group="g", info=env.info(row), turns=1)
        env.end_episode(traj, turn)
        score = asyncio.run(env.reward().score(traj))
        assert score.terms["correct"] == correct and score.terms["type_match"] == pytest.approx(typed), turn
        assert score.total == pytest.approx(correct + 0.5 * typed)  # shaping 0: the other terms weigh nothing
    from rlfactory.envs.bfcl.shaping import _type_ok
    assert _type_ok(3, "float") and not _type_ok(3.5, "integer") and _type_ok([1], "tuple") and _type_ok("x", "any") is None
    assert "type_match" not in asyncio.run(BfclEnv(limit=1).reward().score(traj)).terms  # off by default
    irrelevant = env.load_split("irrelevance")[0]  # no call is the right answer: full type credit, as shaping gives
    traj = Trajectory(id="t", group="g", info=env.info(irrelevant), turns=1)
    env.end_episode(traj, Answer("none of these fits"))
    score = asyncio.run(env.reward().score(traj))
    assert score.terms["correct"] == 1.0 and score.terms["type_match"] == 1.0 and score.total == pytest.approx(1.5)
    traj = Trajectory(id="t", group="g", info=env.info(irrelevant), turns=1)
    env.end_episode(traj, Malformed("not a call"))  # decodes to an error: still no call, still full credit
    score = asyncio.run(env.reward().score(traj))
    assert score.terms["type_match"] == 1.0 and score.total == pytest.approx(score.terms["correct"] + 0.5)


def test_bfcl_is_a_built_in_env_name():
    from rlfactory.envs import make_env

    env = make_env("bfcl", limit=1, prompt_style="bfcl", test_categories="simple,live_irrelevance")
    assert isinstance(env, BfclEnv) and [r["category"] for r in env.load_split("test")] == ["simple_python",
                                                                                          "live_irrelevance"]
    with pytest.raises(TypeError, match="unknown option"):
        make_env("bfcl", promptstyle="bfcl")


def test_splits_keep_reported_questions_and_functions_out_of_training(capsys):
    env = BfclEnv()
    test, train = env.load_split("test"), env.load_split("train")
    assert env.load_split("train") == train  # loaded once: the line below is printed once
    assert {r["category"] for r in test} == {"simple_python", "multiple", "parallel", "parallel_multiple",
                                             "irrelevance"}
    assert all(r["category"].startswith("live_") for r in train)
    everything = [r for c in TRAIN_CATEGORIES for r in load_category(c)]
    assert overlap(everything, test)  # BFCL's live and non-live sets do share names and questions
    assert not overlap(train, test) and 0 < len(train) < len(everything)
    line = capsys.readouterr().err.strip()
    assert line == (f"bfcl split: {len(train)} of {len(everything)} train entries kept; "
                    f"{len(everything) - len(train)} dropped for sharing a function name or a question with the "
                    f"{len(test)} report entries; the rest share none")
    with pytest.raises(ValueError, match="neither train, test nor a category"):
        env.load_split("validation")


def test_test_limit_shows_fewer_test_rows_but_training_still_leaves_out_all_of_them():
    env = BfclEnv(limit=None, test_limit=2)
    test, train = env.load_split("test"), env.load_split("train")
    assert [r["category"] for r in test] == [c for c in env.splits["test"] for _ in range(2)]
    whole = [r for c in env.splits["test"] for r in load_category(c)]
    assert not overlap(train, whole) and overlap([r for c in TRAIN_CATEGORIES for r in load_category(c)], whole)
    # the categories take turns, so a warm start's first demonstrations mix them all
    assert [r["category"] for r in train[:5]] == list(TRAIN_CATEGORIES)
    short = BfclEnv(test_limit=2, train_max_chars=3000).load_split("train")
    assert 0 < len(short) < len(train)
    assert all(len(json.dumps(r["functions"], ensure_ascii=False)) + len(r["question"]) <= 3000 for r in short)
    capped = BfclEnv(test_limit=2, train_max_chars=3000, train_limits={"live_irrelevance": 7}).load_split("train")
    by = lambda rows, c: [r["id"] for r in rows if r["category"] == c]  # noqa: E731
    assert by(capped, "live_irrelevance") == by(short, "live_irrelevance")[:7] and len(by(short, "live_irrelevance")) > 7
    assert by(capped, "live_simple") == by(short, "live_simple")
    with pytest.raises(ValueError, match="train_limits names simple_python, not a train category"):
        BfclEnv(train_limits={"simple_python": 3})
    with pytest.raises(ValueError, match="an integer >= 0"):
        BfclEnv(train_limits={"live_irrelevance": "100"})


def test_solver_gives_the_possible_answer_in_each_style():
    row = load_category("parallel", limit=1)[0]
    demo = BfclEnv().solve(row)
    assert demo[-1]["tool_calls"][0]["function"]["name"] == "spotify.play" and len(demo[-1]["tool_calls"]) == 2
    row = load_category("parallel", "bfcl", limit=1)[0]
    assert BfclEnv(prompt_style="bfcl").solve(row)[-1]["content"].startswith("[spotify.play(")


def test_summary_uses_bfcls_weighting():
    s = accuracy_summary({"simple_python": (1.0, 400), "multiple": (0.5, 200), "live_simple": (1.0, 100),
                          "live_multiple": (0.0, 300), "irrelevance": (0.25, 240)})
    assert s == {"non_live_ast": 0.75, "live_ast": 0.25, "irrelevance": 0.25}


def test_warm_start_demonstrations_show_each_rows_own_functions(tiny):
    from rlfactory.chat import make_tool_manager
    from rlfactory.train.sft import write_demonstrations

    _, tok = tiny
    env = BfclEnv(limit=2, train_categories="live_simple,live_parallel,live_irrelevance")
    rows = env.load_split("train")
    demos = write_demonstrations(env, make_tool_manager(tok, "qwen3"), [], len(rows))
    assert len(demos) == len(rows)
    for row, demo in zip(rows, demos):
        prompt = tok.decode(demo.segments[0].token_ids)
        model = tok.decode([t for s in demo.segments if s.role == "model" for t in s.token_ids])
        assert all(f'"name": "{f["name"]}"' in prompt for f in row["functions"]), row["id"]
        if row["ground_truth"]:
            assert all(f'"name": "{name}"' in model for c in answer_calls(row["ground_truth"]) for name in c)
        else:
            assert "<tool_call>" not in model


def test_solver_skips_answers_bfcl_or_the_schema_refuses():
    env = BfclEnv()
    rows = {r["id"]: r for r in load_category("live_simple")}
    with pytest.raises(ValueError, match="BFCL rejects the possible answer"):
        env.solve(rows["live_simple_106-63-0"])
    with pytest.raises(ValueError, match="breaks aws.lexv2_models.list_exports's schema"):
        env.solve(rows["live_simple_30-8-0"])
