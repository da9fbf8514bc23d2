"""Multi-turn number guessing: the model guesses, the env answers "higher" or "lower". No tools."""

from __future__ import annotations

import re
from typing import Any

from agentrl import Action, Env, Message, Observation, StepResult
from agentrl.errors import ConfigError

_NUMBER = re.compile(r"-?\d+")


class GuessNumberEnv(Env):
    """Guess a seeded integer in ``[low, high]`` within ``max_guesses`` turns.

    Reward 1 for the right guess (``terminated``). Running out of guesses is a rule of the game, stated in
    the prompt: ``truncated`` with reward 0 (the rollout's stop reason ``env_truncated``). A turn with no
    integer in it counts as a guess and gets a reminder of the format.
    """

    def __init__(self, low: int = 1, high: int = 100, max_guesses: int = 7):
        if not (isinstance(low, int) and isinstance(high, int) and low < high):
            raise ConfigError(f"need integers low < high, got low={low!r} high={high!r}")
        if not isinstance(max_guesses, int) or max_guesses < 1:
            raise ConfigError(f"max_guesses must be a positive int, got {max_guesses!r}")
        self.low, self.high, self.max_guesses = low, high, max_guesses

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        self.seed(seed)
        self.target = self.rng.randint(self.low, self.high)
        self.guesses = 0
        prompt = (
            f"I am thinking of an integer between {self.low} and {self.high}. Guess it. "
            f"Reply with just your guess; I will say higher or lower. You have {self.max_guesses} guesses."
        )
        return (Message("user", prompt),), {"target": self.target}

    async def step(self, action: Action) -> StepResult:
        self.guesses += 1
        left = self.max_guesses - self.guesses
        found = _NUMBER.findall(action.text)
        if not found:
            feedback = "Please reply with a single integer."
        else:
            guess = int(found[-1])
            if guess == self.target:
                return StepResult(reward=1.0, terminated=True, info={"guesses": self.guesses})
            feedback = "Higher." if guess < self.target else "Lower."
        if left <= 0:
            return StepResult(truncated=True, info={"guesses": self.guesses})
        return StepResult((Message("user", f"{feedback} {left} guesses left."),))
