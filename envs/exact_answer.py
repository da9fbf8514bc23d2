"""Single-turn arithmetic with an exact answer. No tools."""

from __future__ import annotations

import re
from typing import Any

from agentrl import Action, Env, Message, Observation, StepResult
from agentrl.errors import ConfigError

_ANSWER = re.compile(r"(?:answer\s*[:=]?\s*|\\boxed\{)\s*(-?\d+)", re.IGNORECASE)


class ExactAnswerEnv(Env):
    """One question ``a op b``; reward 1 when the final ``Answer: N`` (or ``\\boxed{N}``) is exact."""

    def __init__(self, max_operand: int = 99):
        if not isinstance(max_operand, int) or max_operand < 2:
            raise ConfigError(f"max_operand must be an int >= 2, got {max_operand!r}")
        self.max_operand = max_operand

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        self.seed(seed)
        rng = self.rng
        a, b = rng.randint(2, self.max_operand), rng.randint(2, self.max_operand)
        op = rng.choice("+-*")
        self.answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        question = f"What is {a} {op} {b}? End your reply with 'Answer: <integer>'."
        return (Message("user", question),), {"answer": self.answer}

    async def step(self, action: Action) -> StepResult:
        found = _ANSWER.findall(action.text)
        correct = bool(found) and int(found[-1]) == self.answer
        return StepResult(reward=float(correct), terminated=True, info={"answer": self.answer})
