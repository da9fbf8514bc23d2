"""The environment contract: Gymnasium's, made async, with chat messages as observations."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from agentrl.types import Action, Message

__all__ = ["INFO_ASSISTANT_MESSAGE", "INFO_TOOL_RECORDS", "Env", "Observation", "StepReturn"]

Observation = tuple[Message, ...]
StepReturn = tuple[Observation, float, bool, bool, dict[str, Any]]

INFO_ASSISTANT_MESSAGE = "assistant_message"
"""``info`` key: the model's turn as the env parsed it (a :class:`Message` with ``tool_calls``)."""
INFO_TOOL_RECORDS = "tool_records"
"""``info`` key: a tuple of :class:`agentrl.types.ToolRecord` for the tool calls this step executed."""


class Env(ABC):
    """An async, Gymnasium-faithful text environment for a language-model agent.

    ``reset(*, seed=None, options=None) -> (observation, info)`` starts an episode. The observation is the
    tuple of messages the model sees first (system prompt, task). ``step(action) -> (observation, reward,
    terminated, truncated, info)`` takes the model's turn (:class:`Action`: its text and sampled ids) and
    returns the *new* messages for the model (tool results, feedback; empty when the episode ended), the
    reward for this step, and Gymnasium's episode-end flags: ``terminated`` — the task itself ended
    (answered, solved, lost); ``truncated`` — a limit of the env cut it short. ``close()`` releases
    resources (sandboxes). Envs are async context managers.

    Bad actions (unparseable text, malformed tool calls) are the model's business: answer them with a
    message and a reward, never an exception. Raise only when the env itself is broken; the rollout records
    that as an ``env_error`` and never scores it as reward 0.

    Two ``info`` keys are read by the rollout: :data:`INFO_ASSISTANT_MESSAGE` (the parsed assistant message
    with tool calls, recorded in the trajectory) and :data:`INFO_TOOL_RECORDS` (what each tool call did).

    Seeding follows Gymnasium: ``reset(seed=s)`` reseeds ``self.np_random`` (a ``random.Random``) so the
    same seed gives the same task; ``reset()`` without a seed continues the current stream.

    Example::

        class Echo(Env):
            async def reset(self, *, seed=None, options=None):
                super().seed(seed)
                return (Message("user", "say hi"),), {}

            async def step(self, action):
                return (), float(action.text.strip() == "hi"), True, False, {}
    """

    tools: ClassVar[Sequence[dict[str, Any]]] = ()
    """OpenAI function schemas of the tools this env offers (rendered into the prompt by the rollout)."""
    spec_id: str | None = None
    """Registered id, set by :func:`agentrl.make`."""
    np_random: random.Random

    def seed(self, seed: int | None) -> None:
        """Reseed ``self.np_random`` (call from ``reset``); ``None`` keeps the current stream."""
        if seed is not None or not hasattr(self, "np_random"):
            self.np_random = random.Random(seed)

    @abstractmethod
    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start an episode; return the first messages and an info dict."""

    @abstractmethod
    async def step(self, action: Action) -> StepReturn:
        """Apply the model's turn; return (new messages, reward, terminated, truncated, info)."""

    async def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources. Idempotent."""

    async def __aenter__(self) -> Env:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
