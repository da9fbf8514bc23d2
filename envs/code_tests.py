"""``code-tests-v0``: write a Python function; hidden unit tests, run in a fresh sandbox, give the reward.

Tasks come from :mod:`agentrl.envs.code_problems` (297 seeded tasks in 11 families; a hash-based held-out
``test`` split). The prompt states the function and shows three examples; the ``run_tests`` tool runs the
model's code on those examples in the episode's sandbox. The final turn (one without a tool call) is graded
by running its last ```python block on eight hidden tests in a *fresh* sandbox (:meth:`CodeTestsEnv.grade`);
the reward is the fraction passed (``partial_credit=True``, the default) or 1.0 only when all pass.

The hidden tests' expected values never leave the host and their inputs never reach the episode's sandbox;
:mod:`agentrl.envs.code_grader` says how each reward hack (fake result lines, reading the tests, exiting
early, endless loops, monkeypatching the harness, writing files) fails. A failing grading sandbox is an
infrastructure failure (the episode is dropped), never reward 0.

Options at ``reset``: ``split`` overrides the constructor's for that episode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agentrl import Message, ScoreContext, StepResult, ToolContext
from agentrl.errors import ConfigError, SandboxError
from agentrl.tools import ParsedTurn, tool

from . import code_problems
from .code_grader import TestOutcome, compare, driver_code, parse_report
from .tool_env import Task, ToolEnv

__all__ = ["CodeTestsEnv", "extract_code"]

SYSTEM_PROMPT = (
    "You write correct Python functions.\n{tools}\n"
    "When you are done, reply with the complete function in one ```python block."
)
EXAMPLE = (
    Message("user", "Write a Python function double(x) that returns 2 * x.\nExamples:\n>>> double(3)\n6"),
    Message("assistant", "```python\ndef double(x):\n    return 2 * x\n```"),
)
"""The worked example shown before every task."""
_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str, fn: str) -> str | None:
    """The answer's code: the last fenced block that defines ``fn`` (else the last block), or the text from
    ``def fn`` on when nothing is fenced; ``None`` when there is no code."""
    blocks = _FENCE.findall(text)
    for block in reversed(blocks):
        if f"def {fn}" in block:
            return str(block)
    if blocks:
        return str(blocks[-1])
    at = text.find(f"def {fn}")
    return text[at:] if at >= 0 else None


def _example_lines(fn: str, cases: Sequence[tuple[Sequence[Any], Any]]) -> str:
    return "\n".join(f">>> {fn}({', '.join(map(repr, args))})\n{want!r}" for args, want in cases)


@tool(needs_sandbox=True)
async def run_tests(code: str, context: ToolContext) -> str:  # noqa: D417 (the model sees Args; context is not its)
    """Run your function on the task's examples and see which pass.

    Args:
        code: The complete Python source of your function.
    """
    fn, cases = context.extra["fn"], context.extra["examples"]
    if context.sandbox is None:
        raise SandboxError("run_tests needs the episode's sandbox")
    src, nonce = driver_code(code, fn, [args for args, _ in cases])
    result = await context.sandbox.run(src, timeout=8.0)
    if result.status.is_infra:
        raise SandboxError(result.message or "the sandbox failed")
    outcomes = compare(parse_report(result, nonce, len(cases)), [want for _, want in cases])
    lines = []
    for k, ((args, want), o) in enumerate(zip(cases, outcomes, strict=True), 1):
        call = f"{fn}({', '.join(map(repr, args))})"
        if o.passed:
            lines.append(f"example {k}: {call} returned {o.got!r}: pass")
        elif o.status == "ok":
            lines.append(f"example {k}: {call} returned {o.got!r}, expected {want!r}: FAIL")
        else:
            lines.append(f"example {k}: {call}: {o.status} ({o.error}): FAIL")
    passed = sum(o.passed for o in outcomes)
    return "\n".join([*lines, f"{passed} of {len(cases)} examples pass."])


class CodeTestsEnv(ToolEnv):
    """Write the function a task describes; the fraction of hidden tests it passes is the reward.

    Args:
        split: ``"train"`` or the held-out ``"test"``.
        partial_credit: Reward the fraction of hidden tests passed (else 1.0 only when all pass).
        n_visible: Examples shown in the prompt (and run by ``run_tests``).
        n_hidden: Hidden tests that grade the answer.
        per_test_s: Seconds one test may take before it counts as failed (timeout).
        **kwargs: Passed to :class:`ToolEnv` (``sandbox_factory``, ``sandbox_pool``, ``limits``, ...).
    """

    def __init__(
        self,
        *,
        split: str = "train",
        partial_credit: bool = True,
        n_visible: int = 3,
        n_hidden: int = 8,
        per_test_s: float = 1.0,
        **kwargs: Any,
    ):
        code_problems.check_split(split)
        if n_visible < 1 or n_hidden < 1 or not 0 < per_test_s <= 5:
            raise ConfigError("n_visible and n_hidden must be >= 1 and per_test_s in (0, 5]")
        self.split, self.partial_credit = split, bool(partial_credit)
        self.n_visible, self.n_hidden, self.per_test_s = n_visible, n_hidden, float(per_test_s)
        kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
        kwargs.setdefault("fewshot", EXAMPLE)
        super().__init__([run_tests], parser="hermes", **kwargs)
        self.code_task: code_problems.CodeTask | None = None
        self.outcomes: tuple[TestOutcome, ...] = ()

    def make_task(self, options: dict[str, Any]) -> Task:
        """A task of the configured split: a function to write, visible examples, hidden tests."""
        split = options.get("split", self.split)
        t = code_problems.sample(self.rng, split, n_visible=self.n_visible, n_hidden=self.n_hidden)
        self.code_task, self.outcomes = t, ()
        prompt = (
            f"{t.statement}\nExamples:\n{_example_lines(t.fn, t.visible)}\n"
            "Reply with the function in a ```python block."
        )
        # Only the visible examples reach the tools (ToolContext.extra); the hidden tests stay on this object.
        extra = {"fn": t.fn, "examples": t.visible}
        return Task(prompt, answer=None, extra=extra, info={"task_id": t.task_id, "split": split})

    async def grade(self, final: ParsedTurn, ctx: ScoreContext) -> float:
        """Run the answer's code on the hidden tests in a fresh sandbox; the fraction passed (or all-or-none).
        A sandbox failure raises :class:`SandboxError` (an infrastructure failure, never reward 0)."""
        t = self.code_task
        assert t is not None
        code = extract_code(final.content, t.fn)
        if code is None:
            self.outcomes = tuple(
                TestOutcome(False, "no_code", error="no code in the answer") for _ in t.hidden
            )
            return 0.0
        budget = self.per_test_s * len(t.hidden) / 2 + 1.0
        src, nonce = driver_code(
            code, t.fn, [a for a, _ in t.hidden], per_test_s=self.per_test_s, budget_s=budget
        )
        result = await ctx.run_fresh(src, timeout=budget + self.per_test_s + 3.0)
        self.outcomes = tuple(compare(parse_report(result, nonce, len(t.hidden)), [w for _, w in t.hidden]))
        passed = sum(o.passed for o in self.outcomes) / len(self.outcomes)
        return passed if self.partial_credit else float(passed == 1.0)

    async def on_final(self, parsed: ParsedTurn) -> StepResult:
        """Grade the final answer against the hidden tests in a fresh sandbox."""
        reward = await self.grade(parsed, self.score_context())
        info = {
            "tests_passed": sum(o.passed for o in self.outcomes),
            "tests": len(self.outcomes),
            "statuses": [o.status for o in self.outcomes],
        }
        return StepResult(reward=reward, terminated=True, info=info)

    def sample_actions(self) -> Sequence[str]:
        """Run the reference solution with ``run_tests``, then answer with it (a right episode)."""
        t = self.code_task
        if t is None:
            return ()
        call = json.dumps({"name": "run_tests", "arguments": {"code": t.reference}})
        return (f"<tool_call>\n{call}\n</tool_call>", f"```python\n{t.reference}```")
