"""BFCL (the Berkeley Function Calling Leaderboard) as an rlfactory env and eval, on the
`bfcl-eval` package's own data and checkers (see package.py for how it is imported)."""

from rlfactory.envs.bfcl.env import BfclEnv, BfclReward, verdict_of

__all__ = ["BfclEnv", "BfclReward", "verdict_of"]
