"""A small OpenEnv environment written with openenv-core's own classes: guess a number from 1 to 8
(the target depends only on the reset seed), with "higher"/"lower" hints; reward 1.0 for the right
guess, which ends the episode. Run as a server: `python openenv_guess.py PORT` (test fixture of
test_envs_adapters)."""

from __future__ import annotations

import random
import sys
from typing import Any, Optional

from pydantic import Field

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    """Guess the hidden number."""

    guess: int = Field(description="your guess, 1 to 8")


class GuessObservation(Observation):
    message: str = ""


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.target, self._state = 1, State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self.target = random.Random(seed).randint(1, 8)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(message="I picked a number from 1 to 8. Guess it with the act tool.")

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self.target:
            return GuessObservation(message="right!", reward=1.0, done=True)
        hint = "higher" if action.guess < self.target else "lower"
        return GuessObservation(message=f"{action.guess} is wrong: go {hint}", reward=0.0, done=False)

    @property
    def state(self) -> State:
        return self._state


if __name__ == "__main__":
    import uvicorn

    from openenv.core.env_server.http_server import create_app

    app = create_app(GuessEnv, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=16)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
