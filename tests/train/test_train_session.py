"""Opening a rollout session (rlfactory/train/session.py) with an env of the caller's own."""

from __future__ import annotations

import asyncio

import pytest
from train_fixtures import run_config

from rlfactory.config import RunConfig, load_config
from rlfactory.train.session import open_rollout


class Bare:
    """An env that is not an Env subclass and implements only reset and max_turns."""

    max_turns = 2

    def reset(self, row):
        return [{"role": "user", "content": "x"}]


def test_an_env_passed_in_is_checked_first_and_refused_by_name(tmp_path):
    cfg = load_config(RunConfig, run_config(tmp_path))

    async def main():
        async with open_rollout(cfg, env=Bare()):
            pass

    with pytest.raises(TypeError, match=r"env Bare does not implement load_split, tools, step, reward, info"):
        asyncio.run(main())
