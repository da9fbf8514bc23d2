"""Shipped fakes for every seam, for agentrl's tests and for users' own.

* :class:`ScriptedPolicy` — a :class:`~agentrl.protocols.Policy` that returns canned token ids and log-probs.
* :class:`FakeSandbox` — a :class:`~agentrl.protocols.Sandbox` that runs code *in-process* (NOT isolated;
  for tests of tool plumbing only — use ``agentrl.sandbox.LocalSandbox`` for anything untrusted).
* :class:`EchoTool` — a :class:`~agentrl.protocols.Tool` that echoes its argument.
* :class:`MemoryStore` — a :class:`~agentrl.protocols.TrajectoryStore` kept in a list.
* :class:`EchoEnv` — the smallest useful :class:`~agentrl.Env`.
* :class:`RecordingWeightSink` — a :class:`~agentrl.protocols.WeightSink` (wrapping a policy: an
  :class:`~agentrl.protocols.UpdatablePolicy`) that records every weight update.
* :class:`FakeSandboxSource` — a :class:`~agentrl.protocols.SandboxSource` lending ``FakeSandbox`` sessions.
* :class:`ScriptedRuntime` — a ``TrainRuntime`` (``agentrl.trainers.runtime``) with no model: scripted
  rewards and delays per task, every update and step outcome recorded, so a loop test runs in milliseconds.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import io
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from agentrl.env import Env, Observation, StepResult
from agentrl.errors import ConfigError
from agentrl.execution import ExecResult, Limits
from agentrl.groups import TrajectoryGroup, group_trajectories
from agentrl.protocols import (
    FinishReason,
    Generation,
    Policy,
    Sampling,
    ToolContext,
    ToolOutput,
    WeightUpdate,
)
from agentrl.rollout import EpisodeDone, schedule_groups
from agentrl.staleness import RuntimeVersions, StepOutcome
from agentrl.types import (
    Action,
    Message,
    Segment,
    StopReason,
    TokenSource,
    ToolStatus,
    Trajectory,
    TrajectoryMeta,
)

__all__ = [
    "EchoEnv",
    "EchoTool",
    "FakeSandbox",
    "FakeSandboxSource",
    "MemoryStore",
    "RecordingWeightSink",
    "ScriptedJudgeBackend",
    "ScriptedPolicy",
    "ScriptedRuntime",
]


class ScriptedPolicy:
    """Returns canned turns in order (cycling), each with fixed per-token log-probs.

    ``turns`` are token-id sequences; a callable ``turns(prompt_ids) -> ids`` is accepted too, and with
    ``with_sampling=True`` a callable ``turns(prompt_ids, sampling) -> ids`` (a turn that depends on the
    request's seed, like a real sampler's, but not on the order of calls). A turn ends with
    ``FinishReason.STOP`` when its last id is in ``stop_ids``; otherwise ``LENGTH``. Turns longer than
    ``sampling.max_new_tokens`` are cut, as a real sampler would. ``delay_s`` (seconds, or a function
    returning them) is slept per turn, like a server's latency; the turn carries the version current when
    it started.
    """

    def __init__(
        self,
        turns: Sequence[Sequence[int]] | Callable[..., Sequence[int]],
        *,
        stop_ids: Sequence[int] = (),
        logprob: float = -0.5,
        version: int = 0,
        with_sampling: bool = False,
        delay_s: float | Callable[[], float] = 0.0,
    ):
        if not callable(turns) and not turns:
            raise ConfigError("ScriptedPolicy needs at least one scripted turn")
        if logprob > 0:
            raise ConfigError(f"a log-prob must be <= 0, got {logprob}")
        if with_sampling and not callable(turns):
            raise ConfigError("with_sampling=True needs turns to be a callable")
        self._turns = turns
        self._with_sampling = with_sampling
        self._delay = delay_s
        self._stop = frozenset(stop_ids)
        self._logprob = logprob
        self._version = version
        self.calls: list[tuple[int, ...]] = []
        """Every prompt it was asked to continue, in order."""

    @property
    def version(self) -> int:
        """The version stamped on each generation."""
        return self._version

    def set_version(self, version: int) -> None:
        """Set the version stamped on later generations."""
        self._version = version

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """The next scripted turn as a :class:`Generation` (recording the prompt in :attr:`calls`)."""
        self.calls.append(tuple(prompt_ids))
        version = self._version
        if callable(self._turns):
            ids = tuple(self._turns(prompt_ids, sampling) if self._with_sampling else self._turns(prompt_ids))
        else:
            ids = tuple(self._turns[(len(self.calls) - 1) % len(self._turns)])
        delay = self._delay() if callable(self._delay) else self._delay
        if delay > 0:
            await asyncio.sleep(delay)
        ids = ids[: sampling.max_new_tokens]
        finish = FinishReason.STOP if ids and ids[-1] in self._stop else FinishReason.LENGTH
        return Generation(ids, (self._logprob,) * len(ids), finish, version)


class FakeSandbox:
    """In-process stand-in for a sandbox: persistent globals, captured stdout/stderr, notebook-style value.

    It enforces nothing (no isolation, no timeout, no memory limit). It exists so tool plumbing can be
    tested without processes; never give it model-written code you would not run yourself.
    """

    def __init__(self, limits: Limits | None = None):
        self.limits = limits or Limits()
        self._globals: dict[str, Any] = {}
        self.closed = False
        self.history: list[str] = []
        """Code of every run, in order."""

    async def run(self, code: str, *, timeout: float | None = None) -> ExecResult:
        """Run ``code`` in this process with ``exec`` (NOT isolated); print output is captured and capped."""
        if self.closed:
            return ExecResult(ToolStatus.SANDBOX_ERROR, message="sandbox is closed")
        self.history.append(code)
        start = time.perf_counter()
        out, err = io.StringIO(), io.StringIO()
        status = ToolStatus.OK
        try:
            tree = ast.parse(code, mode="exec")
            last = tree.body[-1] if tree.body else None
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                if isinstance(last, ast.Expr):
                    tree.body.pop()
                    exec(compile(tree, "<cell>", "exec"), self._globals)
                    value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), self._globals)
                    if value is not None:
                        print(repr(value))
                else:
                    exec(compile(tree, "<cell>", "exec"), self._globals)
        except BaseException:  # the fake mirrors a real sandbox: the code's failure is data
            status = ToolStatus.ERROR
            err.write(traceback.format_exc(limit=-1))
        await asyncio.sleep(0)
        cap = self.limits.output_bytes
        o, e = out.getvalue(), err.getvalue()
        return ExecResult(
            status=status,
            stdout=o[:cap],
            stderr=e[:cap],
            exit_code=None,
            duration_s=time.perf_counter() - start,
            truncated=len(o) > cap or len(e) > cap,
        )

    async def reset(self) -> None:
        """Forget every variable of the session."""
        self._globals = {}

    async def close(self) -> None:
        """Close the session; later runs end in ``SANDBOX_ERROR``."""
        self.closed = True
        self._globals = {}

    async def __aenter__(self) -> FakeSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ScriptedJudgeBackend:
    """A judge backend (:class:`agentrl.rewards.JudgeBackend`) answering canned texts in order (cycling),
    without a model or HTTP. ``prompts`` records what it was asked. Over HTTP, tests put a scripted policy
    behind the agentrl gateway instead."""

    def __init__(self, answers: Sequence[str], *, name: str = "scripted@local"):
        if not answers:
            raise ConfigError("ScriptedJudgeBackend needs at least one answer")
        self.answers, self._name = tuple(answers), name
        self.prompts: list[str] = []
        """Every prompt it was sent, in order."""

    @property
    def name(self) -> str:
        """The name given."""
        return self._name

    async def complete(
        self, system: str, prompt: str, *, max_tokens: int, temperature: float, timeout: float
    ) -> str:
        """The next canned answer."""
        self.prompts.append(prompt)
        return self.answers[(len(self.prompts) - 1) % len(self.answers)]


class EchoTool:
    """A tool named ``echo`` that returns its ``text`` argument."""

    name = "echo"
    needs_sandbox = False
    schema: dict[str, Any] = {  # noqa: RUF012 - a constant schema
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Return the text unchanged.",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string", "description": "Text to echo."}},
                "required": ["text"],
            },
        },
    }

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Return ``arguments['text']`` unchanged."""
        return ToolOutput(content=str(arguments["text"]))


class MemoryStore:
    """Keeps trajectories in a list."""

    def __init__(self) -> None:
        self.trajectories: list[Trajectory] = []

    async def append(self, trajectory: Trajectory) -> None:
        """Keep ``trajectory`` in memory."""
        self.trajectories.append(trajectory)

    def read(self) -> Iterator[Trajectory]:
        """The stored trajectories, in the order they were appended."""
        return iter(list(self.trajectories))

    def read_groups(self, *, size: int | None = None) -> Iterator[TrajectoryGroup]:
        """The stored trajectories as groups, as :meth:`agentrl.JsonlStore.read_groups` reads them."""
        return group_trajectories(list(self.trajectories), size=size)


class EchoEnv(Env):
    """Asks the model to repeat a seeded word; reward 1 for an exact repeat. One turn."""

    WORDS = ("apple", "river", "cloud", "stone", "maple", "tiger", "ocean", "lemon")

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Pick the word for ``seed`` and ask the model to repeat it."""
        self.seed(seed)
        self.word = self.rng.choice(self.WORDS)
        return (Message("user", f"Repeat exactly: {self.word}"),), {"answer": self.word}

    async def step(self, action: Action) -> StepResult:
        """Reward 1.0 for an exact repeat; the episode ends after one turn."""
        return StepResult(reward=float(action.text.strip() == self.word), terminated=True)


# ---------------------------------------------------------------------------------------------------
# Fakes for the weight-update and sandbox-lending seams.
class RecordingWeightSink:
    """A :class:`~agentrl.protocols.WeightSink` that keeps a copy of every update it takes.

    Wrap a policy to make it an :class:`~agentrl.protocols.UpdatablePolicy`: generations come from ``policy``
    and carry this sink's version. Like a real sink it refuses stale updates, and like a remote one it copies
    the tensors (``torch.Tensor.clone`` when available), so a test can check what was published at each
    version even after the learner changed its weights again.
    """

    def __init__(self, policy: Policy | None = None, *, version: int = 0):
        self.policy = policy
        self._version = int(version)
        self.updates: list[WeightUpdate] = []
        """Every update taken, in order, with copied tensors."""

    @property
    def version(self) -> int:
        """The version of the last update taken (or the starting version)."""
        return self._version

    async def load_weights(self, update: WeightUpdate) -> None:
        """Record ``update`` (tensors copied) and take its version; an older version is refused."""
        update.check_after(self._version)
        kept = {k: v.clone() if hasattr(v, "clone") else v for k, v in update.named_tensors.items()}
        self.updates.append(WeightUpdate(update.version, kept))
        self._version = update.version

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Sample from the wrapped policy, stamped with the current version."""
        if self.policy is None:
            raise ConfigError("this RecordingWeightSink wraps no policy; pass one to sample")
        version = self._version
        g = await self.policy.generate(prompt_ids, sampling)
        return dataclasses.replace(g, policy_version=version)


class FakeSandboxSource:
    """Lends :class:`FakeSandbox` sessions (NOT isolated), resetting each one when it comes back.

    ``size`` sessions at most are out at once; a borrower beyond that waits, as with a real pool.
    """

    def __init__(self, size: int = 4, limits: Limits | None = None):
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"size must be a positive int, got {size!r}")
        self._free = [FakeSandbox(limits) for _ in range(size)]
        self._available = asyncio.Semaphore(size)
        self.lent = 0
        """How many sessions were lent so far."""

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[FakeSandbox]:
        """Borrow a session (waiting while ``size`` are out); it is reset when it comes back."""
        async with self._available:
            sb = self._free.pop()
            self.lent += 1
            try:
                yield sb
            finally:
                await sb.reset()
                self._free.append(sb)


class ScriptedRuntime(RuntimeVersions):
    """A ``TrainRuntime`` (:class:`agentrl.trainers.runtime.TrainRuntime`) with no model, sampler or env.

    Each episode is one model turn of two tokens after a two-token prompt; its reward is
    ``reward(seed, member)`` (None: an infrastructure failure), and it takes ``delay_s(seed)`` seconds. Every
    call is recorded: :attr:`runs` (step, seed) in the order groups started, :attr:`updates` (step, groups),
    :attr:`outcomes` (what ``publish`` was told), :attr:`checkpoints`. ``publish`` makes the version current
    for the next turns, as a real sampler does. Pass it to ``agentrl.trainers.train.train`` as
    ``runtime=lambda cfg, run: contextlib.nullcontext(ScriptedRuntime(...))``.
    """

    def __init__(
        self,
        reward: Callable[[int, int], float | None] = lambda seed, member: float(member % 2),
        *,
        delay_s: Callable[[int], float] | float = 0.0,
        start_step: int = 0,
        concurrency: int = 64,
    ):
        self.reward = reward
        self.delay_s = delay_s
        self._start = self._version = int(start_step)
        self.concurrency = concurrency
        self.runs: list[tuple[int, int]] = []
        """(step, seed) of every group run, in the order they started."""
        self.updates: list[tuple[int, list[TrajectoryGroup]]] = []
        """(step, groups) of every update."""
        self.outcomes: list[StepOutcome] = []
        """Every step outcome ``publish`` was handed."""
        self.checkpoints: list[int] = []
        """The step of every checkpoint asked for."""
        self.finished = False
        """True once ``finish_updates`` was called (an update afterwards raises)."""

    def run_groups(
        self, step: int, *, seeds: Iterable[int], group_size: int, meta: TrajectoryMeta
    ) -> AsyncIterator[EpisodeDone]:
        """One group per seed, through the one scheduler (:func:`agentrl.rollout.schedule_groups`)."""
        seeds = list(seeds)
        self.runs.extend((step, seed) for seed in seeds)

        async def episode(seed: int, member: int, group: TrajectoryMeta) -> tuple[Trajectory, ...]:
            version = self._version
            delay = self.delay_s(seed) if callable(self.delay_s) else self.delay_s
            await asyncio.sleep(delay)
            reward = self.reward(seed, member)
            meta = dataclasses.replace(
                group, episode_id=f"{group.group_id}-m{member}", policy_version=version
            )
            return (_scripted_trajectory(meta, reward, version),)

        return schedule_groups(
            episode,
            env_id=meta.env_id,
            seeds=seeds,
            group_size=group_size,
            meta=meta,
            concurrency=self.concurrency,
        )

    async def update(self, step: int, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """Record the update; its metrics say how many rows it trained (registered names only)."""
        if self.finished:
            raise ConfigError("update after finish_updates")
        self.updates.append((step, list(groups)))
        return {"learn/loss": 0.0, "learn/sequences": float(sum(len(g) for g in groups))}

    async def publish(self, version: int, outcome: StepOutcome) -> None:
        """Record the step's outcome; the next turns sample with ``version``."""
        if version != outcome.step + 1:
            raise ConfigError(f"publish of version {version} with the outcome of step {outcome.step}")
        self.outcomes.append(outcome)
        self._version = version

    async def held_out(self, label: str) -> None:
        """No held-out evaluation (None)."""
        return None

    async def finish_updates(self) -> None:
        """Refuse updates from now on."""
        self.finished = True

    async def save_checkpoint(self, run: Any, step: int, *, keep: int) -> None:
        """Record the checkpoint's step (nothing is written)."""
        self.checkpoints.append(step)


def _scripted_trajectory(meta: TrajectoryMeta, reward: float | None, version: int) -> Trajectory:
    return Trajectory(
        token_ids=(1, 2, 3, 4),
        loss_mask=(0, 0, 1, 1),
        logprobs=(None, None, -1.0, -1.0),
        segments=(Segment(TokenSource.PROMPT, 0, 2, -1), Segment(TokenSource.MODEL, 2, 4, 0)),
        messages=(Message("user", "task"), Message("assistant", "answer")),
        rewards=() if reward is None else (reward,),
        terminated=reward is not None,
        stop_reason=StopReason.TERMINATED if reward is not None else StopReason.ENV_ERROR,
        meta=meta,
        policy_versions=(version,),
    )
