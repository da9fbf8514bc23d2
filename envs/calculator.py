"""``calculator-v0``: big-number word problems with a calculator tool, called in the Hermes format."""

from __future__ import annotations

from typing import Any

from agentrl.errors import ConfigError
from agentrl.tools import calculator

from .tool_env import Task, ToolEnv

SYSTEM_PROMPT = (
    "You are a careful assistant. Use the calculator for every computation; never multiply large numbers "
    "in your head. When you are done, reply with 'Answer: <number>'."
)


class CalculatorEnv(ToolEnv):
    """One word problem with ``digits``-digit numbers; reward 1 for the exact answer."""

    def __init__(self, digits: int = 5, **kwargs: Any):
        if not isinstance(digits, int) or not 2 <= digits <= 30:
            raise ConfigError(f"digits must be an int in [2, 30], got {digits!r}")
        self.digits = digits
        kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
        super().__init__([calculator], parser="hermes", **kwargs)

    def make_task(self, options: dict[str, Any]) -> Task:
        rng = self.rng
        a, b, c = (rng.randint(10 ** (self.digits - 1), 10**self.digits - 1) for _ in range(3))
        days = rng.randint(2, 30)
        if rng.random() < 0.5:
            c = rng.randint(1, a * b // days)  # ship no more than the depot holds
            question = (
                f"A depot holds {a} crates with {b} bolts each. It ships {c} bolts a day for "
                f"{days} days. How many bolts are left?"
            )
            answer = a * b - c * days
        else:
            question = (
                f"A warehouse stores {a} boxes of {b} screws and {c} boxes of {days} nails. "
                "How many screws and nails does it store in total?"
            )
            answer = a * b + c * days
        return Task(question, answer=answer, info={"answer": answer})
