"""The environment contract: Gymnasium's, made async, with chat messages as observations.

The whole contract::

    class MyEnv(Env):
        async def reset(self, *, seed=None, options=None) -> tuple[Observation, dict]:
            self.seed(seed)                      # reseeds self.rng (a random.Random)
            return (Message("user", "..."),), {}  # the first messages, and info

        async def step(self, action: Action) -> StepResult:
            return StepResult(observation, reward, terminated=..., truncated=...,
                              assistant_message=..., tool_calls=..., info={...},
                              compact=None)      # or messages: the next sample's whole context

        async def close(self) -> None: ...       # optional; envs are async context managers

        def sample_actions(self) -> Sequence[str]:  # optional: a right episode for the current task
            return ()                              # (check_env plays it: tools run, reward > 0)

Grading code: a tool env (``agentrl.envs.ToolEnv``) scores a final answer with ``def score(self, final)``
or, to run it, ``async def grade(self, final, ctx: ScoreContext) -> float``: ``await ctx.run_fresh(code)``
runs code in a fresh sandbox the model never touched (hidden tests go there, never into the episode's
``ctx.sandbox``); a sandbox failure raises :class:`~agentrl.errors.SandboxError`, so the episode is dropped
as an infrastructure failure, never scored 0.

``step`` returns a :class:`StepResult`. Gymnasium's 5-tuple ``(observation, reward, terminated, truncated,
info)`` is accepted as well and read by :func:`as_step_result` as a ``StepResult`` with no parsed
assistant message and no tool records; its ``info`` is the env's own and nothing in it is read (an
agentrl ``Message``/``ToolRecord`` under the old ``info`` keys is refused rather than silently dropped).
"""

from __future__ import annotations

import math
import random
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentrl.errors import EnvContractError, SandboxError
from agentrl.execution import ExecResult
from agentrl.protocols import Sandbox
from agentrl.reward_records import RewardTerm
from agentrl.types import Action, Message, ToolRecord

__all__ = ["Env", "Observation", "ScoreContext", "StepResult", "as_step_result"]

Observation = tuple[Message, ...]
"""What the model is shown: a tuple of chat messages."""


@dataclass(frozen=True, slots=True)
class StepResult:
    """What :meth:`Env.step` returns. Validated on construction (:class:`EnvContractError`)."""

    observation: Observation = ()
    """The *new* messages for the model (tool results, feedback); empty when the episode ended."""
    reward: float = 0.0
    """Reward for this step (a finite number)."""
    terminated: bool = False
    """The task itself ended: answered, solved, lost (Gymnasium's ``terminated``)."""
    truncated: bool = False
    """A rule of the env cut the episode short (Gymnasium's ``truncated``); the rollout's own limits
    (turns, tokens) are not the env's business."""
    assistant_message: Message | None = None
    """The model's turn as the env parsed it (content and ``tool_calls``); recorded in the trajectory.
    ``None``: the rollout records the turn's plain text."""
    tool_calls: tuple[ToolRecord, ...] = ()
    """What each tool call of this turn did (input, output, status, duration)."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """The env's own diagnostics, free for its author; agentrl reads nothing in it."""
    reward_terms: tuple[RewardTerm, ...] = ()
    """What ``reward`` is made of, when it is a weighted sum of graders (``agentrl.rewards``): recorded on
    the trajectory (with any judge calls) and logged per step as ``reward/<name>``. Their weighted total
    must equal ``reward``."""
    compact: Observation | None = None
    """Context compaction: when set, the model's context is replaced by these messages (the compacted
    history: a summary the env's code wrote, or one the policy wrote in this very turn when the env asked
    for it). The rollout ends the current sample after this turn (stop reason ``compacted``) and goes on in
    a new sample of the same episode whose prompt is these messages; ``observation`` is then ignored."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "observation", _tuple_of(self.observation, Message, "observation"))
        if self.compact is not None:
            object.__setattr__(self, "compact", _tuple_of(self.compact, Message, "compact"))
            if not self.compact:
                raise EnvContractError("step's compact must hold at least one message (the new context)")
            if self.terminated or self.truncated:
                raise EnvContractError("step cannot compact the context of an episode that ends")
        r = self.reward
        if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r):
            raise EnvContractError(f"step's reward must be a finite float, got {r!r}")
        object.__setattr__(self, "reward", float(r))
        if not isinstance(self.terminated, bool) or not isinstance(self.truncated, bool):
            raise EnvContractError(
                f"step's terminated/truncated must be bools, got {self.terminated!r}, {self.truncated!r}"
            )
        msg = self.assistant_message
        if msg is not None and not (isinstance(msg, Message) and msg.role == "assistant"):
            raise EnvContractError(f"step's assistant_message must be an assistant Message, got {msg!r:.200}")
        object.__setattr__(self, "tool_calls", _tuple_of(self.tool_calls, ToolRecord, "tool_calls"))
        object.__setattr__(self, "reward_terms", _tuple_of(self.reward_terms, RewardTerm, "reward_terms"))
        if self.reward_terms and not math.isclose(
            math.fsum(t.value for t in self.reward_terms), self.reward, rel_tol=1e-9, abs_tol=1e-9
        ):
            raise EnvContractError(
                f"step's reward {self.reward!r} is not the weighted sum of its reward_terms "
                f"({math.fsum(t.value for t in self.reward_terms)!r})"
            )
        if not isinstance(self.info, Mapping):
            raise EnvContractError(f"step's info must be a dict, got {type(self.info).__name__}")

    @property
    def infra_error(self) -> str | None:
        """What broke when a tool call failed for infrastructure reasons (the sandbox), else ``None``.
        The rollout ends such an episode as ``sandbox_error`` and never trains on it."""
        for c in self.tool_calls:
            if c.status.is_infra:
                return c.detail or c.output or "sandbox error"
        return None

    def to_gymnasium(self) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """Gymnasium's ``(observation, reward, terminated, truncated, info)`` (``info`` copied)."""
        return self.observation, self.reward, self.terminated, self.truncated, dict(self.info)


def _tuple_of(value: Any, kind: type, what: str) -> tuple[Any, ...]:
    """``value`` as a tuple of ``kind`` (a list is accepted and converted)."""
    items = tuple(value) if isinstance(value, list) else value
    if not isinstance(items, tuple) or not all(isinstance(x, kind) for x in items):
        raise EnvContractError(f"step's {what} must be a tuple of {kind.__name__}, got {value!r:.200}")
    return items


_OLD_INFO_KEYS = ("assistant_message", "tool_records")


def as_step_result(out: object) -> StepResult:
    """Read what ``Env.step`` returned: a :class:`StepResult`, or Gymnasium's 5-tuple (read as a
    ``StepResult`` without a parsed message or tool records). Anything else is an :class:`EnvContractError`.
    """
    if isinstance(out, StepResult):
        return out
    if not (isinstance(out, tuple) and len(out) == 5):
        raise EnvContractError(
            f"step must return a StepResult or (observation, reward, terminated, truncated, info), "
            f"got {out!r:.200}"
        )
    obs, reward, terminated, truncated, info = out
    if isinstance(info, Mapping):
        for key in _OLD_INFO_KEYS:
            value = info.get(key)
            records = isinstance(value, tuple) and bool(value) and isinstance(value[0], ToolRecord)
            if isinstance(value, Message) or records:
                raise EnvContractError(
                    f"step put agentrl records in info[{key!r}], which is no longer read (info is the env's "
                    "own); return StepResult(..., assistant_message=..., tool_calls=...) instead"
                )
    return StepResult(obs, reward, terminated, truncated, info=info)


@dataclass(frozen=True, slots=True)
class ScoreContext:
    """What an async grader (``ToolEnv.grade(final, ctx)``) may use besides the final answer."""

    sandbox: Sandbox | None = None
    """The episode's own session: what the model ran is still there (variables, files). The model could
    write anything into it, so never put hidden tests there or trust what is read back from it."""
    open_sandbox: Callable[[], AbstractAsyncContextManager[Sandbox]] | None = None
    """Opens a fresh session (``async with ctx.open_sandbox() as sb``) that nothing of the episode touched."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """The task's ``extra`` (what the tools saw)."""
    episode_id: str = ""
    """Id of the running episode."""

    async def run_fresh(self, code: str, *, timeout: float | None = None) -> ExecResult:
        """Run ``code`` in a fresh sandbox and return the result (the code's own failures, timeouts
        included, are statuses to score). Raises :class:`SandboxError` when the sandbox itself fails."""
        if self.open_sandbox is None:
            raise SandboxError("this environment has no sandbox to grade in (no open_sandbox)")
        try:
            async with self.open_sandbox() as sb:
                result = await sb.run(code, timeout=timeout)
        except SandboxError:
            raise
        except Exception as e:
            raise SandboxError(f"the grading sandbox failed: {type(e).__name__}: {e}") from e
        if result.status.is_infra:
            raise SandboxError(f"the grading sandbox failed: {result.message or result.stderr[-300:]}")
        return result


class Env(ABC):
    """An async, Gymnasium-faithful text environment for a language-model agent.

    ``reset(*, seed=None, options=None) -> (observation, info)`` starts an episode; the observation is the
    tuple of messages the model sees first (system prompt, task). ``step(action) -> StepResult`` takes the
    model's turn (:class:`Action`: its text and sampled ids) and says what the model sees next, the reward,
    whether the episode ended (``terminated``: the task ended; ``truncated``: a rule of the env cut it
    short), and, for tool envs, the parsed assistant message and the tool records. ``close()`` releases
    resources (sandboxes). The turn and token limits belong to the rollout
    (:class:`~agentrl.episode.RolloutConfig`), not the env; a standalone Gymnasium user sets one with
    ``gymnasium.make(..., max_episode_steps=N)``.

    Bad actions (unparseable text, malformed tool calls) are the model's business: answer them with a
    message and a reward, never an exception. Raise only when the env itself is broken; the rollout records
    that as an ``env_error`` and never scores it as reward 0.

    Randomness: draw every random choice from ``self.rng``, a :class:`random.Random` (not a numpy
    Generator). ``reset(seed=s)`` calls ``self.seed(s)``, so the same seed gives the same task;
    ``reset()`` without a seed continues the current stream.

    Example::

        class Echo(Env):
            async def reset(self, *, seed=None, options=None):
                self.seed(seed)
                return (Message("user", "say hi"),), {}

            async def step(self, action):
                return StepResult(reward=float(action.text.strip() == "hi"), terminated=True)
    """

    tools: ClassVar[Sequence[dict[str, Any]]] = ()
    """OpenAI function schemas of the tools this env offers (rendered into the prompt by the rollout)."""
    spec_id: str | None = None
    """Registered id, set by :func:`agentrl.make`."""
    rng: random.Random
    """The env's random stream (a ``random.Random``); set and reseeded by :meth:`seed`."""

    def seed(self, seed: int | None) -> None:
        """Reseed ``self.rng`` (call from ``reset``); ``None`` keeps the current stream."""
        if seed is not None or not hasattr(self, "rng"):
            self.rng = random.Random(seed)

    @property
    def np_random(self) -> random.Random:
        """Deprecated name of :attr:`rng` (it never was a numpy Generator)."""
        warnings.warn(
            "Env.np_random is deprecated; use Env.rng (a random.Random)", DeprecationWarning, stacklevel=2
        )
        return self.rng

    @abstractmethod
    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start an episode; return the first messages and an info dict."""

    @abstractmethod
    async def step(self, action: Action) -> StepResult:
        """Apply the model's turn; return a :class:`StepResult`."""

    async def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources. Idempotent."""

    def sample_actions(self) -> Sequence[str]:
        """A right episode for the current task (called after ``reset``): model turns that call the env's
        tools and end with a correct final answer, as text. :func:`~agentrl.check_env` plays them and
        requires every tool call to succeed and the episode to end with a reward above 0, so a broken tool
        or grader is found before training. Default: none (the check is skipped)."""
        return ()

    async def __aenter__(self) -> Env:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
