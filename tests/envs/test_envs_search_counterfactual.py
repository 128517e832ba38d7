"""The search env's counterfactual demonstrations (issue 29): `counterfactual_rate` rewrites, per SFT
visit, the fact a demonstration's last search found, in that result and in the answer, so that a
warm start learns to read answers off results. The env and its retriever are real."""

from __future__ import annotations

import random

import pytest

from rlfactory.envs import make_env
from rlfactory.envs.search.world import RELATIONS, extract_fact


@pytest.fixture(scope="module")
def env():
    e = make_env("search", seed=1, n_train_entities=30, n_test_entities=10, topk=1, counterfactual_rate=1.0)
    yield e
    e.close()


def _answer(message: dict) -> str:
    return message["content"].removeprefix("<answer>").removesuffix("</answer>")


def test_a_variant_rewrites_the_last_result_and_the_answer_alike(env):
    rows = env.load_split("train")
    seen = set()
    for row in rows[:40]:
        demo = env.solve(row)
        written = [dict(m) for m in demo]
        variant = env.augment_demo(row, demo, random.Random(0))
        assert demo == written  # the written demonstration is left as it was
        rel = row["extra_info"]["relations"][-1]
        seen.add(rel)
        last = max(i for i, m in enumerate(demo) if m["role"] == "tool")
        old, new = _answer(demo[-1]), _answer(variant[-1])
        assert new != old and new in env._values[rel]  # another value of the same relation, from the train world
        # only the last result and the answer differ; the fact is replaced in place
        assert [i for i, (a, b) in enumerate(zip(demo, variant)) if a != b] == [last, len(demo) - 1]
        assert variant[last]["content"] == demo[last]["content"].replace(f" {old}", f" {new}", 1)
        # the variant is a demonstration of its own world: the solver's reading gives its answer
        subject = variant[last - 1]["tool_calls"][0]["function"]["arguments"]["query"]
        assert extract_fact(rel, subject, variant[last]["content"]) == new
    assert {"birth_year", "birthplace", "country"} <= seen


def test_each_visit_draws_anew_and_a_generator_repeats_its_draw(env):
    row = next(r for r in env.load_split("train") if r["extra_info"]["relations"] == ["birth_year"])
    demo = env.solve(row)
    years = {_answer(env.augment_demo(row, demo, random.Random(k))[-1]) for k in range(30)}
    assert len(years) > 15 and all(1900 <= int(y) <= 1999 for y in years)
    assert env.augment_demo(row, demo, random.Random(7)) == env.augment_demo(row, demo, random.Random(7))


def test_rate_guesses_and_brought_data_leave_demonstrations_as_written(env, tmp_path):
    rows = env.load_split("train")
    row = rows[0]
    demo = env.solve(row)
    env.counterfactual_rate = 0.0
    try:
        assert env.augment_demo(row, demo, random.Random(0)) is None
    finally:
        env.counterfactual_rate = 1.0
    env.counterfactual_rate = 0.5
    try:
        drawn = [env.augment_demo(row, demo, random.Random(k)) is not None for k in range(200)]
        assert 60 < sum(drawn) < 140
    finally:
        env.counterfactual_rate = 1.0
    guess = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
             {"role": "assistant", "content": "1950"}]  # a guess: no search to rewrite
    assert env.augment_demo(row, guess, random.Random(0)) is None
    nq_row = {**row, "extra_info": {"split": "train", "index": 0}}  # brought data: no relation chain
    assert env.augment_demo(nq_row, demo, random.Random(0)) is None
    with pytest.raises(ValueError, match="counterfactual_rate"):
        make_env("search", seed=1, n_train_entities=5, n_test_entities=2, counterfactual_rate=-0.1)


def test_every_relation_has_values_to_draw_from(env):
    assert set(env._values) == set(RELATIONS)
    assert all(len(v) >= 2 for v in env._values.values())


def test_the_solver_marks_its_guesses_and_only_them_when_asked():
    with make_env("search", seed=1, n_train_entities=30, n_test_entities=10, guess_rate=0.5) as e:
        assert not any("guess" in d[-1] for d in (e.solve(r) for r in e.load_split("train")))  # the default
    with make_env("search", seed=1, n_train_entities=30, n_test_entities=10, guess_rate=0.5,
                  learn_guesses=False) as e:
        demos = [e.solve(r) for r in e.load_split("train")]
        guesses = [d for d in demos if not any(m.get("tool_calls") for m in d)]
        assert guesses and len(guesses) < len(demos)
        for d in demos:
            last = d[-1]
            if d in guesses:
                assert last["guess"] and last["content"] == f"<answer>{last['guess']}</answer>"
            else:
                assert "guess" not in last
