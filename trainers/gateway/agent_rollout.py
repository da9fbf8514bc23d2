"""Agent-driven rollouts: ``agentrl train --agent FILE.py:FUNC``.

The agent is any ``async def FUNC(task, base_url) -> float`` written against an OpenAI-compatible client.
Per training step, for each task seed, :class:`AgentRunner` opens ``group_size`` gateway sessions (one group:
same task, same policy version), calls the agent once per session with the session's ``base_url``, and
closes each session with the reward the agent returns. What comes out are ordinary
:class:`~agentrl.types.Trajectory` objects with the meta a native rollout gives them (``env_id``,
``seed``, ``task_id = "<source>:<seed>"``, ``group_id``, ``step``, ``policy_version``), so everything
downstream (credit, learner, checkpoints, replay) is unchanged.

Tasks (:class:`AgentTask`) come from ``--env``: a registered environment (each task is its reset
observation for the seed; a :class:`~agentrl.envs.ToolEnv` is built with ``tools_in_prompt=False`` so that
its tool schemas travel as ``task.tools`` and the gateway renders their instructions exactly as the env
would) or a ``.jsonl`` file with one task per line (``messages`` or ``prompt``, optional ``tools`` and
``id``; every other key goes to ``task.info``), taken in order by seed.

An agent that raises is recorded as an infrastructure failure (never trained on) unless the gateway had
refused it because the session hit a limit (turns, context): then the session is truncated, as a native
episode would be, with reward 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import agentrl
from agentrl.chat import ChatRenderer
from agentrl.errors import ConfigError
from agentrl.loading import load_object
from agentrl.protocols import Policy
from agentrl.rollout import EpisodeDone, EpisodeFn, schedule_groups, task_id
from agentrl.staleness import StepOutcome
from agentrl.types import Trajectory, TrajectoryMeta

from .server import Gateway
from .session import GatewayConfig

if TYPE_CHECKING:
    from agentrl.trainers.train_config import TrainConfig

__all__ = [
    "AgentFn",
    "AgentRunner",
    "AgentTask",
    "EnvTasks",
    "EpisodeSource",
    "JsonlTasks",
    "TaskSource",
    "agent_runner",
    "gateway_config",
    "load_agent",
    "task_source",
]


@dataclass(frozen=True)
class AgentTask:
    """What an agent gets for one episode."""

    id: str
    """The task id (``"<source>:<seed>"``), shared by the members of a group."""
    messages: tuple[Mapping[str, Any], ...]
    """The opening conversation in OpenAI format, ready to send (``list(task.messages)``)."""
    tools: tuple[Mapping[str, Any], ...] = ()
    """Function tool schemas the task offers (OpenAI format); the agent runs the tools itself."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """Metadata: the env's reset info or the JSONL line's other keys (e.g. the reference answer)."""
    seed: int | None = None
    """The task seed."""

    @property
    def prompt(self) -> str:
        """The text of the last user message."""
        return next(
            (str(m.get("content") or "") for m in reversed(self.messages) if m.get("role") == "user"), ""
        )


AgentFn = Callable[[AgentTask, str], Awaitable[float]]
"""``async def agent(task, base_url) -> reward``."""


def load_agent(spec: str) -> AgentFn:
    """The agent function named by ``FILE.py:FUNC`` (or ``package.module:FUNC``)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ConfigError(f"--agent {spec!r}: expected FILE.py:FUNC (or module:FUNC)")
    try:
        fn = load_object(spec)
    except ConfigError as e:
        raise ConfigError(f"--agent {spec!r}: {e}") from None
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(
            f"--agent {spec!r}: {name} must be an async function: async def {name}(task, base_url)"
        )
    return fn


# -------------------------------------------------------------------------------------------------
class TaskSource(Protocol):
    """Where an agent's tasks come from."""

    name: str
    """The source's name (task ids are ``"<name>:<seed>"``)."""
    parser: str
    """The tool-call parser the gateway should use for these tasks."""

    async def task(self, seed: int) -> AgentTask:
        """The task of ``seed`` (deterministic)."""
        ...


class EnvTasks:
    """Tasks from a registered environment: its reset observation for each seed."""

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any] | None = None):
        from agentrl.envs import ToolEnv

        self.name = env_id
        self.kwargs = dict(env_kwargs or {})
        cls = agentrl.registry.entry_point(env_id)
        if isinstance(cls, type) and issubclass(cls, ToolEnv):
            # The schemas go to the agent; the gateway renders the instructions as the env would.
            self.kwargs.setdefault("tools_in_prompt", False)
        probe = agentrl.make(env_id, **self.kwargs)  # fail early on bad kwargs
        parser = getattr(probe, "parser", None)
        self.parser: str = getattr(parser, "name", "hermes")

    async def task(self, seed: int) -> AgentTask:
        """The env's reset observation for ``seed``, with its tools' schemas."""
        env = agentrl.make(self.name, **self.kwargs)
        try:
            obs, info = await env.reset(seed=seed)
            tools = tuple(getattr(env, "tools", ()) or ())
        finally:
            await env.close()
        return AgentTask(
            task_id(self.name, seed), tuple(m.to_dict() for m in obs), tools=tools, info=dict(info), seed=seed
        )


class JsonlTasks:
    """Tasks from a JSONL file, one per line; seed ``s`` takes line ``s mod n``.

    Each line is an object with ``messages`` (OpenAI format) or ``prompt`` (a user message), optionally
    ``tools`` (function schemas) and ``id``; every other key is passed in ``task.info``.
    """

    def __init__(self, path: str | Path, parser: str = "hermes"):
        from .wire import GatewayError, parse_chat_request

        self.name = str(path)
        self.parser = parser
        self.lines: list[dict[str, Any]] = []
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"task file {p} does not exist")
        for n, raw in enumerate(p.read_text().splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError as e:
                raise ConfigError(f"{p}:{n}: not valid JSON: {e}") from None
            if not isinstance(obj, dict):
                raise ConfigError(f"{p}:{n}: each line must be a JSON object")
            if "messages" not in obj and isinstance(obj.get("prompt"), str):
                obj["messages"] = [{"role": "user", "content": obj.pop("prompt")}]
            try:  # the same checks as the gateway's, so a bad task fails here and not mid-run
                parse_chat_request({"model": "m", "messages": obj.get("messages"), "tools": obj.get("tools")})
            except GatewayError as e:
                raise ConfigError(f"{p}:{n}: {e.message} (a task needs 'messages' or 'prompt')") from None
            self.lines.append(obj)
        if not self.lines:
            raise ConfigError(f"task file {p} has no tasks")

    async def task(self, seed: int) -> AgentTask:
        """Line ``seed`` (modulo the number of lines) of the task file."""
        obj = self.lines[seed % len(self.lines)]
        info = {k: v for k, v in obj.items() if k not in ("messages", "tools")}
        return AgentTask(
            task_id(self.name, seed),
            tuple(obj["messages"]),
            tools=tuple(obj.get("tools") or ()),
            info=info,
            seed=seed,
        )


def task_source(env: str, env_kwargs: Mapping[str, Any] | None = None) -> TaskSource:
    """:class:`JsonlTasks` for a ``.jsonl`` path, else :class:`EnvTasks` of the registered env."""
    if env.endswith(".jsonl"):
        return JsonlTasks(env)
    return EnvTasks(env, env_kwargs)


# -------------------------------------------------------------------------------------------------
class EpisodeSource(Protocol):
    """Where the local runtime's episodes come from when no env runs them: ``train --agent``'s
    :class:`AgentRunner` or ``gateway --train``'s :class:`~agentrl.trainers.gateway.live.LiveGroups`."""

    def run_groups(
        self,
        *,
        seeds: Iterable[int],
        group_size: int,
        meta: TrajectoryMeta | None = None,
        limit: asyncio.Semaphore | None = None,
    ) -> AsyncIterator[EpisodeDone]:
        """One group per lease seed, each episode reported as it finishes (the last carries the group)."""
        ...

    def record(self, outcome: StepOutcome) -> None:
        """The loop's outcome of a step (groups trained, dropped and why), as the runtime publishes it."""
        ...


class AgentRunner:
    """Runs an agent against a gateway: ``group_size`` sessions per task, each recorded as trajectories.

    Args:
        agent: ``async def agent(task, base_url) -> float``.
        tasks: Where tasks come from.
        gateway: A started :class:`~agentrl.trainers.gateway.Gateway` (``auto_sessions=False``).
        concurrency: Most agent sessions in flight at once.
    """

    def __init__(self, agent: AgentFn, tasks: TaskSource, gateway: Gateway, *, concurrency: int = 16):
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"concurrency must be a positive int, got {concurrency!r}")
        self.agent = agent
        self.tasks = tasks
        self.gateway = gateway
        self.concurrency = concurrency
        self._limit = asyncio.Semaphore(concurrency)

    async def run_session(self, task: AgentTask, meta: TrajectoryMeta) -> tuple[Trajectory, ...]:
        """One agent episode: open a session, run the agent, record the session with its reward."""
        core = self.gateway.core
        sid = self.gateway.open_session(meta)
        try:
            reward = await self.agent(task, self.gateway.base_url(sid))
            if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
                raise TypeError(f"the agent returned {reward!r:.80}, not a finite number")
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if core.finished(sid):  # it had finished the session itself
                return core.take_result(sid)
            limit = core.limit_reached(sid)
            if limit is not None:  # the gateway refused it for a limit: the model's business
                return await core.finish(sid, 0.0, error=(type(e).__name__, f"{limit.value}: {e}"))
            return await core.abort(sid, type(e).__name__, f"the agent failed: {e}")
        if core.finished(sid):
            return core.take_result(sid)
        return await core.finish(sid, float(reward))

    def record(self, outcome: StepOutcome) -> None:
        """Nothing to add: an agent run's groups are the loop's own tasks, and their outcome is in
        trajectories.jsonl and metrics.jsonl already."""

    def episodes(self, group_size: int) -> EpisodeFn:
        """What runs one agent episode for the scheduler (:func:`agentrl.rollout.schedule_groups`): a gateway
        session on the group's task (made once per group, shared by its members)."""
        made: dict[str, asyncio.Future[AgentTask]] = {}  # group id -> its task, while members still need it
        taken: dict[str, int] = {}

        async def episode(seed: int, member: int, meta: TrajectoryMeta) -> tuple[Trajectory, ...]:
            gid = meta.group_id
            if gid not in made:
                made[gid] = asyncio.ensure_future(self.tasks.task(seed))
            fut = made[gid]
            taken[gid] = taken.get(gid, 0) + 1
            if taken[gid] == group_size:  # the last member to ask: the group no longer needs the entry
                del made[gid], taken[gid]
            return await self.run_session(await fut, meta)

        return episode

    async def run_group(
        self, seed: int, group_size: int, meta: TrajectoryMeta | None = None
    ) -> list[Trajectory]:
        """``group_size`` sessions of the task of ``seed``; one list of their trajectories."""
        events = self.run_groups(seeds=(seed,), group_size=group_size, meta=meta)
        return [done.trajectory async for done in events]

    def run_groups(
        self,
        *,
        seeds: Iterable[int],
        group_size: int,
        meta: TrajectoryMeta | None = None,
        limit: asyncio.Semaphore | None = None,
    ) -> AsyncIterator[EpisodeDone]:
        """Run one group per seed with the one scheduler (:func:`agentrl.rollout.schedule_groups`) under the
        session limit (``limit``, shared with the caller's other groups, or this runner's own); report each
        trajectory as its session finishes (the event that completes a group carries the whole group; a
        session the agent split gives several members). Closing the iteration cancels the agents."""
        return schedule_groups(
            self.episodes(group_size),
            env_id=self.tasks.name,
            seeds=seeds,
            group_size=group_size,
            meta=meta,
            concurrency=self.concurrency,
            limit=limit or self._limit,
        )


def gateway_config(cfg: TrainConfig, tasks: TaskSource) -> GatewayConfig:
    """The trainer's gateway settings: ``cfg.rollout``'s limits and (fixed) temperature, the task source's
    tool-call parser."""
    return GatewayConfig(
        model_name=str(cfg.model),
        parser=tasks.parser,
        max_new_tokens=cfg.rollout.max_new_tokens,
        max_total_tokens=cfg.rollout.max_total_tokens,
        max_turns=cfg.rollout.max_turns,
        temperature=cfg.rollout.temperature,
    )


@contextlib.asynccontextmanager
async def agent_runner(
    cfg: TrainConfig, policy: Policy, renderer: ChatRenderer
) -> AsyncIterator[AgentRunner | None]:
    """For the trainer: an :class:`AgentRunner` with its gateway running in front of ``policy`` when
    ``cfg.agent`` is set, else None. ``cfg.env`` is the task source. Under ``--ray`` each rollout worker
    runs one in front of the inference servers (:class:`~agentrl.trainers.ray.actors.RolloutWorker`).
    """
    if cfg.agent is None:
        yield None
        return
    agent = load_agent(cfg.agent)
    tasks = task_source(cfg.env, cfg.env_kwargs)
    async with Gateway(policy, renderer, gateway_config(cfg, tasks), auto_sessions=False) as gateway:
        yield AgentRunner(agent, tasks, gateway, concurrency=cfg.rollout.concurrency)
