"""Answer normalisation, matching, number parsing and extraction."""

import pytest

from rlfactory.rewards import (
    answer_extractor,
    boxed_answer,
    code_block,
    exact_match,
    last_turn_answer,
    normalize_answer,
    parse_number,
    question_of,
    references_of,
    substring_match,
    tagged_answer,
    token_f1,
)
from rlfactory.trajectory import Segment, Trajectory


def make(model_turns, info=None, prompt="Q?"):
    segs = [Segment("prompt", [1], prompt)]
    for i, text in enumerate(model_turns):
        if i:
            segs.append(Segment("observation", [2], "<information>obs</information>"))
        segs.append(Segment("model", [3], text, logprobs=[0.0]))
    return Trajectory(id="t", group="g", segments=segs, info=info or {})


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  A  cat,   an apple ", "cat apple"),
        ("theater", "theater"),  # articles only as whole words
        ("U.S.A.", "usa"),
        ("the-end", "theend"),  # punctuation goes first, so "the" is no longer a word
        ("Don't STOP", "dont stop"),
        ("\tNew\nYork ", "new york"),
    ],
)
def test_normalize_answer_is_search_r1s(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_substring_and_f1():
    assert exact_match("the  Beatles.", ["Beatles", "x"]) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0
    assert exact_match(None, ["x"]) == 0.0 and exact_match("x", []) == 0.0
    assert substring_match("It was the Beatles band", ["beatles"]) == 1.0
    # pred tokens [barack, obama, jr], gold [barack, obama]: p = 2/3, r = 1 -> f1 = 0.8
    assert token_f1("Barack Obama Jr.", ["a president", "Barack Obama"]) == pytest.approx(0.8)
    assert token_f1("the", ["a"]) == 0.0  # both normalise to nothing
    assert token_f1("paris paris", ["paris"]) == pytest.approx(2 * 0.5 * 1 / 1.5)


@pytest.mark.parametrize(
    "text, value",
    [
        ("1,234", 1234.0),
        ("3.50", 3.5),
        ("$1,234.00", 1234.0),
        ("50%", 50.0),
        ("-7", -7.0),
        ("1/4", 0.25),
        ("1e3", 1000.0),
        ("\\boxed{42}", 42.0),
        ("The answer is 42.", 42.0),
        ("from 3 to 12.5 apples", 12.5),
        (".5", 0.5),
        ("no digits here", None),
        (None, None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_extractors():
    t = make(["<think>hmm</think><search>q</search>", "I think <answer> wrong </answer> then <answer>\n Paris </answer>"])
    assert tagged_answer()(t) == "Paris"
    assert tagged_answer("search")(t) == "q"
    assert answer_extractor("tag:answer")(t) == "Paris"
    assert tagged_answer()(make(["no tags"])) is None
    assert boxed_answer(make(["so \\boxed{\\frac{1}{2}} and \\boxed{x^{2}}"])) == "x^{2}"
    assert boxed_answer(make(["\\boxed{unclosed"])) is None
    assert last_turn_answer(make(["call", "<think>reason</think>\n  Final: 7 "])) == "Final: 7"
    code = make(["```python\nprint(1)\n```\ntext\n```sql\nSELECT 1;\n```"])
    assert code_block("sql")(code) == "SELECT 1;" and code_block()(code) == "SELECT 1;"
    assert code_block("python")(code) == "print(1)"
    assert answer_extractor("code:python")(code) == "print(1)"
    assert answer_extractor("rlfactory.rewards.text:boxed_answer") is boxed_answer
    with pytest.raises(ValueError):
        answer_extractor("bogus")


def test_references_and_question_from_the_row():
    assert references_of(make([], {"answer": "Paris"})) == ["Paris"]
    assert references_of(make([], {"ground_truth": ["a", "b"], "answer": "x"})) == ["a", "b"]
    assert references_of(make([], {"golden_answers": ("x", 3)})) == ["x", "3"]
    assert references_of(make([], {"reward_model": {"ground_truth": {"target": ["t1"]}}})) == ["t1"]
    assert references_of(make([], {"answer": 12})) == ["12"]
    assert references_of(make([], {})) == []
    assert question_of(make([], {"question": "Who?"})) == "Who?"
    assert question_of(make([], {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u?"}]})) == "u?"
    assert question_of(make([], {}, prompt="raw prompt")) == "raw prompt"
