"""``long-chain-v0``: a chained tool task longer than one context, with three ways to cope.

The user gives K two-digit numbers; the model may not add them itself: it calls the ``A`` (add) tool
K - 1 times, carrying the running sum forward, and ends with the answer. Every turn restates the numbers
still to add (a scratchpad), so the history grows quadratically in K::

    user       37 82 15 64 ...
    assistant  [82 15 64 ...]A37+82          tool  119
    assistant  [15 64 ...]A119+15            tool  134
    ...
    assistant  R1234                         reward 1 iff 1234 is the sum of all K numbers

With the defaults (K = 16) the whole history needs about 640 tokens (one token per character); run it
with ``--rollout.max-total-tokens`` well below that (``RECOMMENDED_MAX_TOTAL_TOKENS``), and the mode says
what happens when the context fills (``--env-kwargs '{"context": "..."}'``):

* ``env-compaction``: after every ``compact_every`` tool calls the env compacts the context itself: the
  next sample starts from a user message the env's code writes, the running sum (the tool's last output)
  followed by the numbers still to add (``StepResult.compact``);
* ``policy-compaction``: after every ``compact_every`` tool calls the env asks the policy for the summary
  (a user message ``C``); the policy's next turn, sampled and trained like any other, must be
  ``S<running sum> <numbers still to add>``, and the next sample starts from exactly what it wrote. A wrong
  summary leads to a wrong answer; a turn that is no summary at all ends the episode with reward 0;
* ``truncate``: nothing is compacted; the rollout stops the episode when the context is full
  (stop reason ``max_tokens``, reward 0).

Samples, compaction and how they are trained: :mod:`agentrl.samples`. The vocabulary is digits, space and
``+[]ACRS``, so a character-level policy can learn it (``experiments/long_horizon``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import zlib
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from agentrl import Action, Message, StepResult, ToolStatus
from agentrl.errors import ConfigError
from agentrl.tools import ParsedTurn, tool
from agentrl.types import ToolCall

from .tool_env import Task, ToolEnv

__all__ = ["RECOMMENDED_MAX_TOTAL_TOKENS", "ContextMode", "LongChainEnv", "expert_turns"]

RECOMMENDED_MAX_TOTAL_TOKENS = 400
"""A context budget (``--rollout.max-total-tokens``, character-level tokens) that holds one sample of
``compact_every = 4`` calls at K = 16 (about 270) but not the whole history (about 640)."""

_CALL = re.compile(r"\[[0-9 ]*\]A(\d{1,6})\+(\d{1,6})")
_FINAL = re.compile(r"R(\d{1,6})")
_SUMMARY = re.compile(r"S(\d{1,6})((?: \d{1,6})*)")
COMPACT_REQUEST = "C"
"""The user message by which the env asks the policy for a summary (policy-compaction)."""


class ContextMode(StrEnum):
    """What happens when the history outgrows the context."""

    ENV_COMPACTION = "env-compaction"
    """The env's code writes the summary every ``compact_every`` calls; a new sample starts from it."""
    POLICY_COMPACTION = "policy-compaction"
    """The env asks for a summary every ``compact_every`` calls; the policy writes it (a trained turn)."""
    TRUNCATE = "truncate"
    """No compaction: the rollout's ``max_total_tokens`` ends the episode when the context is full."""


@tool(name="A", thread=False)  # named as the model writes it
def add(a: int, b: int) -> str:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return str(a + b)


class ChainParser:
    """``[..]A<a>+<b>`` calls the ``A`` (add) tool; ``R<n>`` is the final answer; anything else is a final
    turn without an answer (reward 0). Summaries (``S...``) are read by the env, not here."""

    name = "long-chain"

    def parse(self, text: str, *, id_prefix: str = "call") -> ParsedTurn:
        """Read one model turn (never raises)."""
        text = text.strip()
        m = _CALL.fullmatch(text)
        if m:
            args = json.dumps({"a": int(m.group(1)), "b": int(m.group(2))})
            return ParsedTurn(text, (ToolCall(f"{id_prefix}_0", "A", args),))
        m = _FINAL.fullmatch(text)
        return ParsedTurn(text, (), (), m.group(1) if m else None)

    def format_instructions(self, tools: Sequence[Any]) -> str:
        """The format is learned from demonstrations; nothing goes into the prompt."""
        return ""

    def format_output(self, name: str, content: str) -> str:
        """The tool's result, bare."""
        return content


def split_of(numbers: Sequence[int]) -> str:
    """``"test"`` for about one chain in ten (a hash of the numbers), ``"train"`` otherwise."""
    return "test" if zlib.crc32(" ".join(map(str, numbers)).encode()) % 10 == 0 else "train"


def expert_turns(numbers: Sequence[int], mode: ContextMode | str, compact_every: int) -> list[str]:
    """The model turns of a right episode in ``mode`` (summary turns included), without stop tokens."""
    mode = ContextMode(mode)
    acc, out = numbers[0], []
    for calls, j in enumerate(range(1, len(numbers)), start=1):
        rest = " ".join(map(str, numbers[j:]))
        out.append(f"[{rest}]A{acc}+{numbers[j]}")
        acc += numbers[j]
        if mode is ContextMode.POLICY_COMPACTION and calls % compact_every == 0 and j + 1 < len(numbers):
            out.append(summary_text(acc, numbers[j + 1 :], prefix="S"))
    out.append(f"R{acc}")
    return out


def summary_text(acc: int, rest: Sequence[int], *, prefix: str = "") -> str:
    """The compacted state: the running sum, then the numbers still to add."""
    return prefix + " ".join(map(str, (acc, *rest)))


class LongChainEnv(ToolEnv):
    """Add K numbers with a tool, carrying the sum across more turns than fit one context.

    Args:
        k: How many numbers (K - 1 tool calls; more in policy-compaction, which adds summary turns).
        context: A :class:`ContextMode` (or its value): who compacts the context, or nobody.
        compact_every: Tool calls per sample before the context is compacted (compaction modes).
        split: ``"train"`` or the held-out ``"test"``.
        **kwargs: Passed to :class:`ToolEnv`.
    """

    def __init__(
        self,
        *,
        k: int = 16,
        context: ContextMode | str = ContextMode.ENV_COMPACTION,
        compact_every: int = 4,
        split: str = "train",
        **kwargs: Any,
    ):
        try:
            self.mode = ContextMode(context)
        except ValueError:
            raise ConfigError(
                f"long-chain: context must be one of {[m.value for m in ContextMode]}, got {context!r}"
            ) from None
        if not isinstance(k, int) or isinstance(k, bool) or not 2 <= k <= 64:
            raise ConfigError(f"long-chain: k must be an int in [2, 64], got {k!r}")
        if not isinstance(compact_every, int) or isinstance(compact_every, bool) or compact_every < 1:
            raise ConfigError(f"long-chain: compact_every must be a positive int, got {compact_every!r}")
        if split not in ("train", "test"):
            raise ConfigError(f"long-chain: split must be 'train' or 'test', got {split!r}")
        self.k, self.compact_every, self.split = k, compact_every, split
        kwargs.pop("tool_format", None)  # the chain format is the task's own; a run's choice cannot apply
        super().__init__([add], parser=ChainParser(), **kwargs)
        self.numbers: list[int] = []
        self.calls = 0
        """Tool calls so far in the episode (each consumes one number)."""
        self.awaiting_summary = False

    def make_task(self, options: dict[str, Any]) -> Task:
        """K two-digit numbers from the split (rejection sampling on the hash split)."""
        split = options.get("split", self.split)
        while True:
            nums = [self.rng.randint(10, 99) for _ in range(self.k)]
            if split_of(nums) == split:
                break
        self.numbers, self.calls, self.awaiting_summary = nums, 0, False
        info = {"numbers": " ".join(map(str, nums)), "context": self.mode.value}
        return Task(prompt=" ".join(map(str, nums)), answer=sum(nums), info=info)

    def sample_actions(self) -> Sequence[str]:
        """A right episode for the current task, summaries included."""
        return expert_turns(self.numbers, self.mode, self.compact_every)

    async def step(self, action: Action) -> StepResult:
        """A tool call, the final answer, or (when asked for) the policy's summary."""
        if self.awaiting_summary:
            return self._summary(action)
        result = await super().step(action)
        ok = [r for r in result.tool_calls if r.status is ToolStatus.OK]
        if not ok or result.terminated or result.truncated:
            return result
        self.calls += 1
        left = self.numbers[self.calls + 1 :]
        if self.mode is ContextMode.TRUNCATE or self.calls % self.compact_every or not left:
            return result
        if self.mode is ContextMode.ENV_COMPACTION:  # the env's code writes the summary
            summary = summary_text(int(ok[-1].output), left)
            return dataclasses.replace(result, compact=(Message("user", summary),))
        self.awaiting_summary = True  # policy-compaction: ask for the summary in the next turn
        return dataclasses.replace(
            result, observation=(*result.observation, Message("user", COMPACT_REQUEST))
        )

    def _summary(self, action: Action) -> StepResult:
        """The policy's summary turn: it becomes the next sample's whole context, as written."""
        self.awaiting_summary = False
        self.turn += 1
        text = action.text.strip()
        assistant = Message("assistant", text)
        if _SUMMARY.fullmatch(text) is None:  # asked for a summary, got something else: the task failed
            self.done = True
            return StepResult(reward=0.0, terminated=True, assistant_message=assistant)
        return StepResult(assistant_message=assistant, compact=(Message("user", text[1:]),))
