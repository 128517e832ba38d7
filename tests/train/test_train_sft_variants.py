"""Demonstrations an env rewrites per SFT visit (`Env.augment_demo`, issue 29): each visit of
`sft_train` gets its own variant, re-rendered through the real ToolManager, reproducibly; an env that
does not rewrite trains on its demonstrations as written. A scripted env here; the search env's real
counterfactuals are tested in tests/envs/test_envs_search_counterfactual.py."""

from __future__ import annotations

import random

import torch

from rlfactory.chat import make_tool_manager
from rlfactory.config import SftConfig
from rlfactory.envs import Env
from rlfactory.tiny import resolve_model
from rlfactory.tools.base import ToolSpec
from rlfactory.train.sft import demo_to_trajectory, sft_train, write_demonstrations

SEARCH = ToolSpec("search", "Search the corpus.", {"type": "object", "properties": {"query": {"type": "string"}}})
CITIES = ["Duser", "Rofan", "Kelar", "Mibos", "Tazun", "Vopek"]


class BornEnv(Env):
    name = "born"

    def __init__(self, rewrite: bool) -> None:
        self.rewrite = rewrite
        self.calls: list[int] = []

    def reset(self, row):
        return [{"role": "system", "content": "Answer with search."},
                {"role": "user", "content": f"Where was {row['who']} born?"}]

    def load_split(self, split):
        return [{"who": "Kano Tami", "city": "Duser"}, {"who": "Lipo Saru", "city": "Rofan"}]

    def solve(self, row):
        return self.reset(row) + [
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"query": row["who"]}}}]},
            {"role": "tool", "content": f"{row['who']} was born in {row['city']}."},
            {"role": "assistant", "content": f"<answer>{row['city']}</answer>"}]

    def augment_demo(self, row, messages, rng):
        if not self.rewrite:
            return None
        city = rng.choice(CITIES)
        self.calls.append(1)
        return messages[:3] + [{"role": "tool", "content": f"{row['who']} was born in {city}."},
                               {"role": "assistant", "content": f"<answer>{city}</answer>"}]


def _tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))


def test_visits_get_variants_rendered_like_a_written_demonstration_and_reproducibly():
    tok = _tok()
    tm = make_tool_manager(tok, "qwen3")
    env = BornEnv(rewrite=True)
    demos = write_demonstrations(env, tm, [SEARCH], 2, seed=3)
    assert len(demos) == 2
    written = list(demos)  # iterating gives them as written, and draws nothing
    assert demos.visits == 0 and env.calls == []
    assert [tok.decode(t.input_ids).count("Duser") for t in written] == [2, 0]
    visits = [demos[0] for _ in range(12)]
    assert demos.visits == demos.augmented == 12
    answers = {tok.decode([i for i, m in zip(t.input_ids, t.loss_mask) if m]).split("<answer>")[1] for t in visits}
    assert len(answers) > 2  # each visit draws its own city
    for t in visits:  # a variant is rendered exactly as the same conversation written by the solver would be
        city = next(c for c in CITIES if f"<answer>{c}" in tok.decode(t.input_ids))
        row = {"who": "Kano Tami", "city": city}
        expect = demo_to_trajectory(env.solve(row), tm, [SEARCH], demo_id=t.id)
        assert t.segments == expect.segments and t.id == written[0].id
    again = write_demonstrations(BornEnv(rewrite=True), tm, [SEARCH], 2, seed=3)
    assert [again[0].input_ids for _ in range(12)] == [t.input_ids for t in visits]
    other = write_demonstrations(BornEnv(rewrite=True), tm, [SEARCH], 2, seed=4)
    assert [other[0].input_ids for _ in range(12)] != [t.input_ids for t in visits]


def test_an_env_that_does_not_rewrite_trains_on_its_demonstrations_as_written():
    tm = make_tool_manager(_tok(), "qwen3")
    demos = write_demonstrations(BornEnv(rewrite=False), tm, [SEARCH], 2)
    first = list(demos)
    assert all(demos[i] is first[i] for i in (0, 1, 0, 1))
    assert demos.augmented == 0


def test_sft_train_draws_a_variant_for_every_visit():
    from transformers import AutoModelForCausalLM

    tok = _tok()
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny:1m"))
    env = BornEnv(rewrite=True)
    demos = write_demonstrations(env, make_tool_manager(tok, "qwen3"), [SEARCH], 2)
    torch.manual_seed(0)
    history = sft_train(model, demos, tok.pad_token_id, SftConfig(steps=3, batch_size=2, warmup_steps=1))
    assert len(history) == 3 and demos.augmented == len(env.calls) == 6


GUESS = [{"role": "system", "content": "Answer with search."},
         {"role": "user", "content": "When was Kano Tami born?"}]


def _learned(tok, traj) -> str:
    return tok.decode([t for t, m in zip(traj.input_ids, traj.loss_mask) if m])


def test_a_guessed_value_stays_out_of_the_loss_and_the_turn_stays_in_it():
    tok = _tok()
    for family, content in (("searchr1", "1944"), ("qwen3", "<answer>1944</answer>")):
        tm = make_tool_manager(tok, family)
        plain = demo_to_trajectory(GUESS + [{"role": "assistant", "content": content}], tm, [SEARCH])
        guessed = demo_to_trajectory(GUESS + [{"role": "assistant", "content": content, "guess": "1944"}], tm, [SEARCH])
        assert guessed.input_ids == plain.input_ids and guessed.turns == plain.turns == 1  # the same text
        assert "1944" in _learned(tok, plain)
        learned = _learned(tok, guessed)
        assert "1944" not in learned and "19" not in learned, (family, learned)
        assert "<answer>" in learned and "</answer>" in learned  # answering at once is still learned
        masked = tok.decode([t for t, m in zip(guessed.input_ids[guessed.prompt_len:],
                                                guessed.loss_mask[guessed.prompt_len:]) if not m])
        assert masked.strip() == "1944", (family, masked)


def test_a_guess_that_is_not_in_the_content_is_a_clear_error():
    import pytest

    tm = make_tool_manager(_tok(), "searchr1")
    with pytest.raises(ValueError, match="guess '1955' is not part of its content"):
        demo_to_trajectory(GUESS + [{"role": "assistant", "content": "1944", "guess": "1955"}], tm, [SEARCH])


def test_full_text_steps_learn_the_whole_text_but_the_guess():
    from rlfactory.train.sft import full_text_view

    tok = _tok()
    tm = make_tool_manager(tok, "searchr1")
    guessed = demo_to_trajectory(GUESS + [{"role": "assistant", "content": "1944", "guess": "1944"}], tm, [SEARCH])
    view = full_text_view(guessed)
    assert view.input_ids == guessed.input_ids
    learned = _learned(tok, view)
    assert "When was Kano Tami born?" in learned and "<answer>" in learned and "</answer>" in learned
    assert "1944" not in learned and "19" not in learned
    plain = full_text_view(demo_to_trajectory(GUESS + [{"role": "assistant", "content": "1944"}], tm, [SEARCH]))
    assert "1944" in _learned(tok, plain) and sum(plain.loss_mask) == len(plain.input_ids) - 1
