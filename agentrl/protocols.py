"""The seams of agentrl: Policy (and WeightSink, how new weights reach it), Sandbox (and SandboxSource),
Tool and TrajectoryStore.

Everything on the far side of a seam is swappable and typed only against these Protocols. Shipped fakes for
each live in :mod:`agentrl.testing`. The *implementations* live elsewhere: sandbox backends in
``agentrl.sandbox`` (the top-level ``sandbox/`` folder), tools in ``agentrl.tools``, policy backends in
``agentrl.policies``, the JSONL store in ``agentrl.store``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from agentrl.errors import ConfigError, FormatError
from agentrl.execution import ExecResult, Limits
from agentrl.types import ToolStatus, Trajectory

__all__ = [
    "FinishReason",
    "Generation",
    "Policy",
    "Sampling",
    "Sandbox",
    "SandboxSource",
    "Tool",
    "ToolContext",
    "ToolOutput",
    "TrajectoryStore",
    "UpdatablePolicy",
    "WeightSink",
    "WeightUpdate",
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
# Weights: how a learner's update reaches the samplers
@dataclass(frozen=True, slots=True, eq=False)
class WeightUpdate:
    """New weights, as the learner publishes them after an update; one object goes to every sink.

    The sink's signature takes this record rather than loose arguments so that what a distributed trainer
    will need next (a checksum of the bytes, the publishing rank, a bucketed transfer) can be added here
    without changing every :class:`WeightSink`.
    """

    version: int
    """The learner step that produced these weights. The sink reports it as its ``version`` afterwards and
    stamps it on every generation sampled with them."""
    named_tensors: Mapping[str, Any]
    """Parameter name -> tensor, named as in ``model.state_dict()``; read-only. These are the learner's own
    tensors, not copies: a sink that keeps them beyond :meth:`WeightSink.load_weights` must copy them."""

    def __post_init__(self) -> None:
        v = self.version
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"a weights version must be an int >= 0, got {v!r}")
        if not isinstance(self.named_tensors, Mapping) or not self.named_tensors:
            raise ConfigError("a WeightUpdate needs at least one named tensor")
        object.__setattr__(self, "named_tensors", MappingProxyType(dict(self.named_tensors)))

    def check_after(self, current: int) -> None:
        """Raise :class:`ConfigError` unless these weights may replace version ``current``.

        Versions never go back: an update older than what a sink holds is a stale message (a retry that
        arrived late), and taking it would label new samples with weights they were not drawn from. The same
        version again is allowed (a resync after a restart)."""
        if self.version < current:
            raise ConfigError(
                f"weights of version {self.version} are older than the version already loaded ({current}); "
                "refusing a stale update"
            )


@runtime_checkable
class WeightSink(Protocol):
    """Takes new weights from the learner: an in-process sampler, an inference engine, a remote server.

    When :meth:`load_weights` returns, every generation that starts afterwards samples with the new weights
    and records ``update.version``. The synchronous trainer publishes between rollouts, when nothing is
    generating; a sink that also accepts updates while generating says what in-flight generations see. A
    sampler that shares the learner's model object (the same tensors) has nothing to copy and only takes the
    version.
    """

    @property
    def version(self) -> int:
        """Version of the weights loaded now (the learner step that produced them)."""
        ...

    async def load_weights(self, update: WeightUpdate) -> None:
        """Make ``update``'s weights current, then report ``update.version``.

        Raises:
            ConfigError: the update is older than the loaded version, or does not fit the model (unknown
                names, wrong shapes).
            PolicyError: the backend could not take the weights (engine failure); the old version stays.
        """
        ...


@runtime_checkable
class UpdatablePolicy(Policy, WeightSink, Protocol):
    """A policy the trainer can push new weights to: what ``agentrl train`` samples with."""


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


@runtime_checkable
class SandboxSource(Protocol):
    """Lends sandbox sessions, one per episode (``agentrl.sandbox.SandboxPool``).

    ``async with source.acquire() as sb`` lends a session that is already started and clean; leaving the
    block takes it back (the source resets it before lending it again). A source that cannot lend one in
    time raises :class:`~agentrl.errors.SandboxError`.
    """

    def acquire(self) -> AbstractAsyncContextManager[Sandbox]:
        """Borrow one session for the duration of an ``async with`` block."""
        ...


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
    status: ToolStatus = ToolStatus.OK
    """How the call went. A status's string value (``"error"``) is accepted and converted."""
    detail: str = ""
    """Diagnostics kept on the trajectory but not shown to the model."""

    def __post_init__(self) -> None:
        if not isinstance(self.status, ToolStatus):
            try:
                object.__setattr__(self, "status", ToolStatus.parse(self.status))
            except FormatError as e:  # a tool's own argument, not data read from outside
                raise ConfigError(str(e)) from None


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

    @property
    def needs_sandbox(self) -> bool:
        """True when the tool runs code in ``ToolContext.sandbox``. An environment opens a sandbox session
        for an episode only when one of its tools says so (a plain class attribute is enough)."""
        ...

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Run the tool. Exceptions are turned into an error message for the model by the caller."""
        ...


# ---------------------------------------------------------------------------------------------------
# Store
@runtime_checkable
class TrajectoryStore(Protocol):
    """Append-only storage of trajectories."""

    def append(self, trajectory: Trajectory) -> Awaitable[None]:
        """Persist one trajectory durably (flushed before the awaitable completes; ``async def`` is fine)."""
        ...

    def read(self) -> Iterator[Trajectory]:
        """Iterate over every stored trajectory, in write order."""
        ...
