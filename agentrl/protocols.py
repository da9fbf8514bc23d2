"""The seams of agentrl: Policy, Sandbox, Tool and TrajectoryStore.

Everything on the far side of a seam is swappable and typed only against these Protocols. Shipped fakes for
each live in :mod:`agentrl.testing`. The *implementations* live elsewhere: sandbox backends in
``agentrl.sandbox`` (the top-level ``sandbox/`` folder), tools in ``agentrl.tools``, policy backends in
``agentrl.policies``, the JSONL store in ``agentrl.store``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from agentrl.errors import ConfigError
from agentrl.execution import ExecResult, Limits
from agentrl.types import Trajectory

__all__ = [
    "FinishReason",
    "Generation",
    "Policy",
    "Sampling",
    "Sandbox",
    "Tool",
    "ToolContext",
    "ToolOutput",
    "TrajectoryStore",
]


# ---------------------------------------------------------------------------------------------------
# Policy
class FinishReason(StrEnum):
    """Why a generation stopped."""

    STOP = "stop"
    """A stop token (end of turn / EOS) was sampled; it is included in ``token_ids``."""
    LENGTH = "length"
    """``max_new_tokens`` was reached without a stop token."""


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling settings for one generation."""

    max_new_tokens: int = 512
    """Most tokens to sample in this turn."""
    temperature: float = 1.0
    """Softmax temperature; the recorded log-probs are those of the tempered distribution actually sampled."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off). With top_p < 1 the recorded log-probs are of the truncated
    distribution, which is not what the learner recomputes; keep 1.0 for on-policy training."""
    seed: int | None = None
    """Per-request seed where the backend supports one."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")


@dataclass(frozen=True, slots=True)
class Generation:
    """The tokens a policy sampled for one turn, exactly as sampled."""

    token_ids: tuple[int, ...]
    """Sampled ids, including the stop token when ``finish_reason`` is STOP."""
    logprobs: tuple[float, ...]
    """The sampler's log-prob of each sampled id (same length as ``token_ids``)."""
    finish_reason: FinishReason
    """Why sampling stopped."""
    policy_version: int = 0
    """Version of the weights that sampled (learner step)."""

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ConfigError(f"Generation has {len(self.token_ids)} ids but {len(self.logprobs)} log-probs")


@runtime_checkable
class Policy(Protocol):
    """Samples one model turn from a prompt given as token ids (token in, token out)."""

    @property
    def version(self) -> int:
        """Version of the current weights (incremented by the trainer after each update)."""
        ...

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Sample a continuation of ``prompt_ids`` until a stop token or ``sampling.max_new_tokens``.

        Raises:
            PolicyError: the backend failed (infrastructure, never the model's fault).
        """
        ...


# ---------------------------------------------------------------------------------------------------
# Sandbox
@runtime_checkable
class Sandbox(Protocol):
    """A stateful Python session for one episode: variables, imports and files persist across ``run``.

    Used as an async context manager; leaving the context reclaims every process, mount and file.
    Backends: ``agentrl.sandbox.LocalSandbox`` (bubblewrap), ``DockerSandbox``, ``E2BSandbox``.
    """

    async def run(self, code: str, *, timeout: float | None = None) -> ExecResult:
        """Run ``code``; show the value of the last expression like a notebook cell.

        Never raises for anything the code does: failures come back as a status. ``timeout`` may only
        lower the configured wall-clock limit.
        """
        ...

    async def reset(self) -> None:
        """Discard all state and start a fresh session."""
        ...

    async def close(self) -> None:
        """Release everything. Idempotent."""
        ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...


# ---------------------------------------------------------------------------------------------------
# Tool
@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool may use besides its arguments: the episode's resources."""

    sandbox: Sandbox | None = None
    """The episode's sandbox session (fresh per episode, shared by the episode's calls)."""
    limits: Limits | None = None
    """Limits the environment applies to tool code (the sandbox clamps them to its own maximum)."""
    episode_id: str = ""
    """Id of the running episode."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Environment-specific resources (a lookup table, a database handle)."""


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What a tool returns: the text the model will read and how the call went."""

    content: str
    """Text shown to the model (already capped by the tool)."""
    status: str = "ok"
    """A :class:`agentrl.types.ToolStatus` value."""
    detail: str = ""
    """Diagnostics kept on the trajectory but not shown to the model."""


@runtime_checkable
class Tool(Protocol):
    """A callable the model can invoke by name with JSON arguments."""

    @property
    def name(self) -> str:
        """The function name the model uses."""
        ...

    @property
    def schema(self) -> dict[str, Any]:
        """OpenAI function schema: ``{"type": "function", "function": {name, description, parameters}}``."""
        ...

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Run the tool. Exceptions are turned into an error message for the model by the caller."""
        ...


# ---------------------------------------------------------------------------------------------------
# Store
@runtime_checkable
class TrajectoryStore(Protocol):
    """Append-only storage of trajectories."""

    async def append(self, trajectory: Trajectory) -> None:
        """Persist one trajectory durably (flushed before returning)."""
        ...

    def read(self) -> Iterator[Trajectory]:
        """Iterate over every stored trajectory, in write order."""
        ...
