"""Live training: ``agentrl gateway --train`` trains on sessions that arrive from outside.

Harnesses run by someone else (Claude Code, Codex, an SDK agent) open sessions on the gateway by themselves
and end each one with ``POST /s/<sid>/finish``, with its reward and ``info.task_id``, or without a reward,
posting it later (``POST /s/<sid>/reward``, until ``--reward-deadline``). :class:`LiveGroups` collects the
recorded sessions by task id, and hands the training loop a group each time ``--group-size`` sessions of one
task have their rewards.

It is an episode source of the one training loop, as ``train --agent``'s
:class:`~agentrl.trainers.gateway.agent_rollout.AgentRunner` is: :func:`train_live` runs
:func:`agentrl.trainers.train.train` on the local runtime with this source instead of an agent, so admission
under ``--max-staleness``, the learner, checkpoints and metrics are those of ``agentrl train``. Each group the
loop leases waits for the next complete group of sessions (first complete, first handed).

What is not trained, and why (``live_groups.jsonl`` in the run folder has one line per handed group, with the
loop's reason when it was dropped):

* a session that got no reward before the deadline, or was cancelled (idle expiry, a policy error, the
  gateway stopping), is recorded as an infrastructure failure and handed on as a group of its own, which the
  loop drops (``never rewarded ...`` / ``every episode failed ...``);
* a group whose oldest token is more than ``--max-staleness`` versions older than the step that trains it
  is dropped by the loop (``finished over the staleness bound``);
* sessions of a task that has not reached the group size when training ends are not trained on.

Every recorded session is in ``sessions.jsonl`` as the gateway recorded it; the groups handed to the loop
are in ``trajectories.jsonl`` with their step and group id, as in any run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.chat import ChatRenderer
from agentrl.errors import ConfigError
from agentrl.groups import Episode, TrajectoryGroup
from agentrl.protocols import Policy
from agentrl.rollout import EpisodeDone
from agentrl.staleness import StepOutcome
from agentrl.types import Trajectory, TrajectoryMeta

from .session import GatewayConfig

if TYPE_CHECKING:
    from agentrl.trainers.local import SourceFactory
    from agentrl.trainers.train_setup import TrainConfig

    from .serve_config import ServeConfig

__all__ = ["LEDGER_FILE", "SESSIONS_FILE", "LiveGroups", "live_train_config", "train_live"]

LEDGER_FILE = "live_groups.jsonl"
"""One line per group handed to the loop: its sessions, and whether it was trained (or why not)."""
SESSIONS_FILE = "sessions.jsonl"
"""Every session the gateway recorded, as recorded (trained or not)."""

SAMPLING_FLAGS = ("max_new_tokens", "max_total_tokens", "max_turns", "temperature")
"""The gateway's own sampling settings; with --train they are --rollout.* (the learner's)."""


@dataclass(frozen=True)
class _Handed:
    group_id: str
    task_id: str
    sessions: tuple[str, ...]


class LiveGroups:
    """Groups of outside sessions for the training loop (an episode source, like ``AgentRunner``).

    Args:
        group_size: Sessions of one task per group (``--group-size``).
        ledger: Where :meth:`record` appends one line per handed group (None: nowhere).
    """

    def __init__(self, group_size: int, *, ledger: Path | None = None):
        self.group_size = group_size
        self.ledger = ledger
        self._waiting: dict[str, list[Episode]] = {}
        """Task id -> rewarded sessions waiting for their group to fill."""
        self._ready: asyncio.Queue[tuple[Episode, ...]] = asyncio.Queue()
        self._handed: dict[int, _Handed] = {}
        """Lease seed -> the group handed for it, until its step's outcome is recorded."""

    def add(self, session: tuple[Trajectory, ...]) -> None:
        """A session the gateway recorded (its trajectories: the samples of one episode). One that cannot be
        trained on (never rewarded, cancelled) is handed on alone, for the loop to drop with its reason."""
        if not session:
            return
        if any(t.infra_failure for t in session):
            self._ready.put_nowait((session,))
            return
        task = session[0].meta.task_id
        waiting = self._waiting.setdefault(task, [])
        waiting.append(session)
        if len(waiting) == self.group_size:
            del self._waiting[task]
            self._ready.put_nowait(tuple(waiting))

    @property
    def waiting(self) -> dict[str, int]:
        """Task id -> rewarded sessions still waiting for a group."""
        return {task: len(v) for task, v in self._waiting.items()}

    def run_groups(
        self,
        *,
        seeds: Iterable[int],
        group_size: int,
        meta: TrajectoryMeta | None = None,
        limit: asyncio.Semaphore | None = None,
    ) -> AsyncIterator[EpisodeDone]:
        """The next complete group for each lease seed, as the loop's runtime reports episodes (the last one
        carries the group). The trajectories get the lease's step and a group id of their own; ``limit`` is
        not used (the sessions run outside)."""
        if group_size != self.group_size:
            raise ConfigError(f"live groups hold {self.group_size} sessions, the loop asked for {group_size}")
        return self._groups(tuple(seeds), meta or TrajectoryMeta())

    async def _groups(self, seeds: tuple[int, ...], meta: TrajectoryMeta) -> AsyncIterator[EpisodeDone]:
        for seed in seeds:
            episodes = await self._ready.get()
            gid = f"live-s{meta.step}-{seed}"
            trajs = tuple(
                dataclasses.replace(
                    t,
                    meta=dataclasses.replace(
                        t.meta, step=meta.step, group_id=gid, policy_version=t.min_policy_version
                    ),
                )
                for e in episodes
                for t in e
            )
            group = TrajectoryGroup(trajs)
            sessions = tuple(str(e[0].meta.extra.get("session_id", "")) for e in episodes)
            self._handed[seed] = _Handed(gid, group.task_id, sessions)
            for t in trajs[:-1]:
                yield EpisodeDone(t)
            yield EpisodeDone(trajs[-1], group)

    def record(self, outcome: StepOutcome) -> None:
        """Append the step's outcome to the ledger: each handed group, trained or dropped with the loop's
        reason."""
        why = {d.seed: d.reason for d in outcome.dropped}
        lines = []
        for seed in (*outcome.trained, *why):
            h = self._handed.pop(seed, None)
            if h is None:  # a lease that never got a group (a straggler cancelled while waiting)
                continue
            row: dict[str, Any] = {"step": outcome.step, "group_id": h.group_id, "task_id": h.task_id}
            row.update(sessions=list(h.sessions), trained=seed not in why, reason=why.get(seed))
            lines.append(json.dumps(row) + "\n")
        if self.ledger is not None and lines:
            with self.ledger.open("a") as f:
                f.writelines(lines)


def live_train_config(serve: ServeConfig, given: set[str], train: TrainConfig) -> TrainConfig:
    """The training settings of ``agentrl gateway --train`` (``train`` parsed from the same flags), checked.

    Raises:
        ConfigError: a setting live training cannot honour.
    """
    clash = sorted(given & set(SAMPLING_FLAGS))
    if clash:
        flags = ", ".join(f"--{n.replace('_', '-')}" for n in clash)
        raise ConfigError(
            f"with --train, {flags} are the trainer's: pass --rollout.{clash[0].replace('_', '-')} (the "
            "learner must score the distribution that was sampled)"
        )
    if train.agent is not None:
        raise ConfigError(
            "--agent runs an agent of yours (agentrl train --agent); --train trains on sessions "
            "that arrive from outside: pass one"
        )
    if train.output.resume is not None:
        raise ConfigError("--train does not resume a run (the sessions came from outside); start a new one")
    if train.deploy.ray is not None:
        raise ConfigError("--train runs in this process; --ray is not supported with it")
    if train.async_.max_staleness < 1:
        raise ConfigError(
            "--train needs --max-staleness >= 1: outside sessions keep sampling while the learner updates, "
            "so a group is at least one version old when its step trains (and the sampler must have its "
            "own copy of the weights)"
        )
    if "eval.tasks" in given and train.output.eval.tasks:
        raise ConfigError("--train has no held-out evaluation (the sessions bring their own tasks)")
    out = dataclasses.replace(train.output, eval=dataclasses.replace(train.output.eval, tasks=0))
    return dataclasses.replace(train, output=out)


def gateway_settings(serve: ServeConfig, train: TrainConfig) -> GatewayConfig:
    """The gateway's settings under --train: the serve flags, with the trainer's limits and temperature."""
    own = {f.name: getattr(serve, f.name) for f in dataclasses.fields(GatewayConfig)}
    own.update(
        max_new_tokens=train.rollout.max_new_tokens,
        max_total_tokens=train.rollout.max_total_tokens,
        max_turns=train.rollout.max_turns,
        temperature=train.rollout.temperature,
    )
    return GatewayConfig(**own)


def train_live(serve: ServeConfig, train: TrainConfig, *, api_key: str | None) -> int:
    """Serve the gateway in front of the trainer's sampler and train on its sessions (``agentrl gateway
    --train``); returns the exit status. SIGINT/SIGTERM stop it as they stop ``agentrl train``."""
    from agentrl.run import RunDir
    from agentrl.trainers.local import local_runtime
    from agentrl.trainers.runtime import TrainRuntime
    from agentrl.trainers.train import train as run_training

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # checkpoint writes would each draw a bar (as agentrl train)

    def runtime(cfg: TrainConfig, run: RunDir) -> contextlib.AbstractAsyncContextManager[TrainRuntime]:
        return local_runtime(cfg, run, source=live_source(serve, api_key, run.path))

    try:
        out = asyncio.run(run_training(train, runtime=runtime))
    except KeyboardInterrupt:
        return 130
    print(f"done: {out}")
    return 0


def live_source(serve: ServeConfig, api_key: str | None, run_dir: Path) -> SourceFactory:
    """The local runtime's episode source for ``--train``: a gateway in front of the sampler, recording
    every session into ``sessions.jsonl`` and handing them to a :class:`LiveGroups`."""

    @contextlib.asynccontextmanager
    async def source(cfg: TrainConfig, policy: Policy, renderer: ChatRenderer) -> AsyncIterator[LiveGroups]:
        from agentrl import JsonlStore

        from .server import Gateway

        live = LiveGroups(cfg.batch.group_size, ledger=run_dir / LEDGER_FILE)
        store = JsonlStore(run_dir / SESSIONS_FILE, mode="append")
        try:
            settings = gateway_settings(serve, cfg)
            async with Gateway.from_serve_config(
                serve, policy, renderer, settings, store=store, api_key=api_key, on_session=live.add
            ) as gw:
                print(
                    f"agentrl gateway --train: {cfg.model} at {gw.url}; agents use base_url "
                    f"{gw.url}/s/<session_id>/v1 and end each session with POST "
                    f"{gw.url}/s/<session_id>/finish "
                    '{"reward": r, "info": {"task_id": ...}} (or without the reward, then POST .../reward '
                    f"within {serve.reward_deadline:g} s); a group is {cfg.batch.group_size} rewarded "
                    "sessions of one task_id",
                    flush=True,
                )
                yield live
        finally:
            store.close()

    return source
