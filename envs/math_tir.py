r"""``math-tir-v0``: tool-integrated math. The model writes ```python blocks, reads their output, answers.

Problems come from :mod:`agentrl.envs.math_problems` (seeded; eight kinds; difficulty 1-3; a hash-based
held-out ``test`` split). The prompt is built for small chat models such as SmolLM2-135M-Instruct: a short
system prompt, one worked example as prior turns (question, python block, its output, ``Answer: N``), and
the same one-line instruction after every question.
Reward: 1.0 for a right final answer (``Answer: N`` or ``\boxed{N}``, graded by math-verify through
:func:`agentrl.rewards.grade_math`: ``\frac{1}{2}``, ``0.5`` and ``1/2`` are equal), else 0.0, or
``format_reward`` when a wrong answer was at least a number. The grade is recorded as the reward term
``math`` with its reason (``equal``, ``not equal: ...``, ``no parsable answer``, ``timed out``).

Options at ``reset``: ``split`` (``"train"``/``"test"``), ``difficulty`` (1-3 or ``None`` for mixed),
``kinds`` (a list of problem kinds). They override the constructor's values for that episode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl import Message, StepResult
from agentrl.errors import ConfigError
from agentrl.rewards import Grade, grade_math
from agentrl.tools import ParsedTurn, PythonTool, parse_number

from . import math_problems
from .tool_env import Task, ToolEnv

SYSTEM_PROMPT = (
    "You solve math problems by writing Python code.\n{tools}\n"
    "When you know the result, reply with 'Answer: <number>'."
)
INSTRUCTION = "Write Python code to solve it."
"""Appended to every question (the example's too): with it SmolLM2-135M-Instruct wrote a python block for
6 of 8 problems in a probe, against 1 of 8 without it."""
EXAMPLE = (
    Message("user", f"What is 487 * 36 - 259?\n{INSTRUCTION}"),
    Message("assistant", "```python\nprint(487 * 36 - 259)\n```"),
    Message("tool", "```output\n17273\n```", tool_call_id="example_0", name="python"),
    Message("assistant", "Answer: 17273"),
)
"""The worked example shown before every question (tool message as the python parser formats it)."""


class MathTIREnv(ToolEnv):
    """Seeded math problems solved with a persistent python tool; reward for the exact answer.

    Args:
        split: ``"train"`` or the held-out ``"test"``.
        difficulty: 1 (easy) to 3, or ``None`` to mix levels.
        kinds: Problem kinds to draw from (default: all of ``math_problems.KINDS``).
        format_reward: Reward for a wrong answer that is at least a number (0 = off).
        python_timeout: Seconds per python run.
        max_output_chars: How much python output the model sees (head and tail).
        **kwargs: Passed to :class:`ToolEnv` (``sandbox_factory``, ``sandbox_pool``, ``limits``, ...).
    """

    def __init__(
        self,
        *,
        split: str = "train",
        difficulty: int | None = 1,
        kinds: Sequence[str] | None = None,
        format_reward: float = 0.0,
        python_timeout: float = 10.0,
        max_output_chars: int = 600,
        **kwargs: Any,
    ):
        self.split, self.difficulty = split, difficulty
        self.kinds = (kinds,) if isinstance(kinds, str) else kinds
        math_problems.check(split, self.kinds, difficulty)
        if not 0.0 <= format_reward < 1.0:
            raise ConfigError(f"format_reward must be in [0, 1), got {format_reward!r}")
        self.format_reward = format_reward
        kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
        kwargs.setdefault("fewshot", EXAMPLE)
        python = PythonTool(timeout=python_timeout, max_output_chars=max_output_chars)
        super().__init__([python], parser="python", **kwargs)

    def make_task(self, options: dict[str, Any]) -> Task:
        """A problem drawn from :mod:`~agentrl.envs.math_problems` (``options`` may set split, kinds,
        difficulty)."""
        kinds = options.get("kinds", self.kinds)
        problem = math_problems.sample(
            self.rng,
            split=options.get("split", self.split),
            kinds=(kinds,) if isinstance(kinds, str) else kinds,
            difficulty=options.get("difficulty", self.difficulty),
        )
        info = {
            "task_id": problem.task_id,
            "kind": problem.kind,
            "difficulty": problem.difficulty,
            "split": math_problems.split_of(problem.question),
            "answer": str(problem.answer),
        }
        return Task(prompt=f"{problem.question}\n{INSTRUCTION}", answer=problem.answer, info=info)

    def score(self, parsed: ParsedTurn) -> float:
        """1.0 for the right answer, ``format_reward`` for a wrong but readable number, else 0."""
        return self.grade_answer(parsed).score

    def grade_answer(self, parsed: ParsedTurn) -> Grade:
        """math-verify's grade of the final answer; a wrong answer that reads as a number gets
        ``format_reward`` (the hand-written :func:`~agentrl.tools.parse_number` decides "is a number":
        math-verify parses ``x`` or ``five`` into expressions too and does not say if it saw a number)."""
        assert self.task is not None
        grade = grade_math(parsed.answer, self.task.answer)
        if grade.score == 0.0 and self.format_reward and parse_number(parsed.answer) is not None:
            return Grade(self.format_reward, f"format reward: {grade.reason}")
        return grade

    async def on_final(self, parsed: ParsedTurn) -> StepResult:
        """Grade the final answer and end the episode, recording the grade as the term ``math``."""
        grade = self.grade_answer(parsed)
        return StepResult(reward=grade.score, terminated=True, reward_terms=(grade.term("math"),))
