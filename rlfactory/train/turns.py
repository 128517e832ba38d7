"""Turn-level advantages for the trainer: trajectories -> the [B, K] tensors the estimators of
kind "turn" take (rlfactory/algos/turns.py), and their advantages spread over each turn's tokens
in the train batch's column layout (batch.py)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import torch

from rlfactory.algos.advantages import get_advantage
from rlfactory.algos.turns import turn_token_advantages
from rlfactory.config import AlgoConfig
from rlfactory.trajectory import Trajectory


@dataclass
class TurnTensors:
    rewards: torch.Tensor
    """[B, K] float: each model turn's own reward (`Segment.reward`, 0 where unscored)."""
    mask: torch.Tensor
    """[B, K] bool: row b has a turn k."""
    states: torch.Tensor
    """[B, K] long: equal ids for turns that saw an identical observation history (the prompt and
    every observation before the turn, token for token): GiGPO's anchor states."""


def turn_tensors(trajs: Sequence[Trajectory]) -> TurnTensors:
    """The per-turn tensors of `trajs` (K = the most turns of any, at least 1)."""
    turns = [t.turn_segments() for t in trajs]
    k = max([len(x) for x in turns] + [1])
    rewards = torch.zeros((len(trajs), k), dtype=torch.float32)
    mask = torch.zeros((len(trajs), k), dtype=torch.bool)
    states = torch.full((len(trajs), k), -1, dtype=torch.long)
    ids: dict[tuple[int, ...], int] = {}
    for b, t in enumerate(trajs):
        seen: list[int] = []  # the observation history: prompt and observation ids, in order
        j = 0
        for seg in t.segments:
            if seg.role == "model":
                rewards[b, j] = seg.reward if seg.reward is not None else 0.0
                mask[b, j] = True
                states[b, j] = ids.setdefault(tuple(seen), len(ids))
                seen.append(-1)  # a turn boundary: (obs A)(obs B) differs from (obs AB)
                j += 1
            else:
                seen.extend(seg.token_ids)
    return TurnTensors(rewards, mask, states)


def token_turns(trajs: Sequence[Trajectory], width: int) -> torch.Tensor:
    """[B, width] long: the 0-based turn of each completion column's token (batch.py's columns:
    the tokens after the prompt), -1 on prompt, observation and padding columns."""
    out = torch.full((len(trajs), width), -1, dtype=torch.long)
    for b, t in enumerate(trajs):
        start = max(t.prompt_len, 1) if t.input_ids else 0  # collate's prompt (a first token at least)
        col, k = -start, 0
        for seg in t.segments:
            n = len(seg.token_ids)
            if seg.role == "model":
                lo, hi = max(col, 0), min(col + n, width)
                if lo < hi:
                    out[b, lo:hi] = k
                k += 1
            col += n
    return out


def turn_advantages(algo: AlgoConfig, trajs: Sequence[Trajectory], rewards: torch.Tensor, groups: torch.Tensor,
                    valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [B, K], turn mask [B, K]) of `algo.advantage` (a "turn" estimator) over the
    whole step's trajectories; `rewards` [B] are their outcome rewards."""
    tt = turn_tensors(trajs)
    fn = get_advantage(algo.advantage)
    offered = {"states": tt.states, "gamma": algo.turn_gamma, "reward_weight": algo.turn_reward_weight,
               "step_weight": algo.turn_step_weight, "norm_by_std": algo.turn_norm_by_std}
    params = inspect.signature(fn).parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in offered.items() if takes_all or k in params}
    return fn(rewards, tt.rewards, tt.mask, groups, valid, **kwargs), tt.mask


def spread_over_tokens(turn_adv: torch.Tensor, trajs: Sequence[Trajectory], width: int) -> torch.Tensor:
    """[B, width]: each row's turn advantages on its turns' tokens (0 elsewhere)."""
    return turn_token_advantages(turn_adv, token_turns(trajs, width))
