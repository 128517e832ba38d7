"""BFCL multi-turn scoring with bfcl-eval's own checker on its real executable backends: the ground
truth passes, wrong or missing calls fail, and one entry scored again starts from a fresh state."""

from __future__ import annotations

import pytest

pytest.importorskip("bfcl_eval")

from rlfactory.envs.bfcl.multi_turn import (  # noqa: E402
    check_multi_turn,
    load_multi_turn,
    multi_turn_categories,
    to_call_strings,
)

PER_CATEGORY = 2


@pytest.mark.parametrize("category", ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                                      "multi_turn_long_context"])
def test_ground_truth_passes_and_wrong_calls_fail(category):
    assert category in multi_turn_categories()
    for row in load_multi_turn(category, PER_CATEGORY):
        truth = row["ground_truth"]
        assert check_multi_turn(row, [[turn] for turn in truth]).valid, row["id"]
        silent = check_multi_turn(row, [[] for _ in truth])
        assert not silent.valid and silent.error_type.startswith("multi_turn:")
        short = check_multi_turn(row, [[turn] for turn in truth[:-1]])
        assert not short.valid and short.error_type == "multi_turn:force_terminated"


def test_a_wrong_argument_changes_the_backend_state_and_fails():
    row = load_multi_turn("multi_turn_base", 1)[0]  # mkdir temp, mv into temp, ...
    wrong = [[[call.replace("temp", "tmp") for call in turn]] for turn in row["ground_truth"]]
    verdict = check_multi_turn(row, wrong)
    assert not verdict.valid and verdict.error_type == "multi_turn:instance_state_mismatch"


def test_each_check_starts_from_the_entrys_initial_state():
    # bfcl-eval reuses backend instances by model name and entry: under one name, a right answer
    # scored after a wrong one would replay onto the wrong one's file system and fail
    row = load_multi_turn("multi_turn_base", 1)[0]
    wrong = [[[call.replace("temp", "tmp") for call in turn]] for turn in row["ground_truth"]]
    assert not check_multi_turn(row, wrong).valid
    assert check_multi_turn(row, [[turn] for turn in row["ground_truth"]]).valid


def test_calls_become_bfcl_call_strings_and_bad_categories_are_named():
    assert to_call_strings([{"cd": {"folder": "document"}}]) == ["cd(folder='document')"]
    with pytest.raises(ValueError, match="'simple_python' is not a multi-turn category"):
        load_multi_turn("simple_python")
