"""Load a recorded run (a run directory or a bare ``trajectories.jsonl``) and pick trajectories from it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, StoreError
from agentrl.metrics import read_metrics
from agentrl.run import TRAJECTORIES_FILE, RunDir
from agentrl.store import StoreIssue, read_trajectories
from agentrl.types import StopReason, ToolStatus, Trajectory

__all__ = ["Filter", "Run", "filter", "load", "select"]


@dataclass(frozen=True)
class Run:
    """A recorded run: its trajectories and, for a run directory, its metrics and checkpoints."""

    path: Path
    """What was loaded (a run directory or a JSONL file)."""
    trajectories_path: Path
    """The JSONL file the trajectories came from."""
    run_dir: RunDir | None
    """The run directory (settings, checkpoints...; it has a ``config.json``), None for a bare JSONL file."""
    trajectories: tuple[Trajectory, ...]
    """Every readable trajectory, in file order; ``--show K`` and reports use these indices."""
    metrics: tuple[Mapping[str, Any], ...] = ()
    """``metrics.jsonl`` rows, one per training step."""
    issues: tuple[StoreIssue, ...] = ()
    """Lines that could not be read (a torn last line)."""

    def checkpoint_steps(self) -> tuple[int, ...]:
        """Steps whose checkpoint is on disk (``checkpoints/step-N`` = weights after N steps)."""
        return self.run_dir.checkpoint_steps() if self.run_dir is not None else ()

    def metrics_row(self, step: int) -> Mapping[str, Any] | None:
        """The ``metrics.jsonl`` row of ``step`` (the last one if a resume rewrote it)."""
        rows = [r for r in self.metrics if r.get("step") == step]
        return rows[-1] if rows else None


def load(path: str | os.PathLike[str]) -> Run:
    """Load a run directory (``trajectories.jsonl`` + ``config.json`` + ``metrics.jsonl``) or a JSONL file.

    A JSONL file whose folder holds a ``config.json`` is treated as that run's record.
    """
    p = Path(path)
    if p.is_dir():
        traj_path = RunDir(p).trajectories_path
        if not traj_path.exists():
            raise StoreError(f"{p} has no {TRAJECTORIES_FILE}; pass a run directory or a .jsonl file")
    elif p.exists():
        traj_path = p
    else:
        raise StoreError(f"{p} does not exist")
    folder = RunDir(traj_path.parent)
    run_dir = folder if folder.exists() else None
    issues: list[StoreIssue] = []
    trajs = tuple(read_trajectories(traj_path, issues=issues))
    metrics: tuple[Mapping[str, Any], ...] = ()
    if run_dir is not None and run_dir.metrics_path.exists():
        metrics = tuple(read_metrics(run_dir.path))
    return Run(p, traj_path, run_dir, trajs, metrics, tuple(issues))


# =====================================================================================================
# Filtering
# =====================================================================================================
_STOPS = {s.value for s in StopReason}
_STATUSES = {s.value for s in ToolStatus}


@dataclass(frozen=True)
class Filter:
    """Which trajectories to keep; every given criterion must hold (``None`` = any)."""

    step: int | None = None
    """``meta.step`` equals this."""
    group: str | None = None
    """``meta.group_id`` starts with this, or ``meta.task_id`` equals it."""
    min_reward: float | None = None
    """Total reward ≥ this."""
    max_reward: float | None = None
    """Total reward ≤ this."""
    stop_reason: str | None = None
    """``stop_reason`` equals this (``terminated``, ``max_turns``, ``turn_tokens``, ...)."""
    errors: bool | None = None
    """True: only episodes with a recorded failure (or a non-ok tool call); False: only clean ones."""
    tool_status: str | None = None
    """Some tool call ended with this status (``ok``, ``error``, ``timeout``, ...)."""
    grep: str | None = None
    """Case-insensitive text in a message, a tool call's arguments or output, or an action."""

    def __post_init__(self) -> None:
        if self.stop_reason is not None and self.stop_reason not in _STOPS:
            raise ConfigError(f"unknown stop reason {self.stop_reason!r}; one of {sorted(_STOPS)}")
        if self.tool_status is not None and self.tool_status not in _STATUSES:
            raise ConfigError(f"unknown tool status {self.tool_status!r}; one of {sorted(_STATUSES)}")

    def matches(self, traj: Trajectory) -> bool:
        """Whether ``traj`` passes every criterion."""
        m = traj.meta
        if self.step is not None and m.step != self.step:
            return False
        if self.group is not None and not (m.group_id.startswith(self.group) or m.task_id == self.group):
            return False
        r = traj.reward
        if self.min_reward is not None and r < self.min_reward:
            return False
        if self.max_reward is not None and r > self.max_reward:
            return False
        if self.stop_reason is not None and traj.stop_reason.value != self.stop_reason:
            return False
        if self.errors is not None and _has_errors(traj) != self.errors:
            return False
        if self.tool_status is not None and not any(
            c.status.value == self.tool_status for c in traj.tool_calls
        ):
            return False
        if self.grep:
            needle = self.grep.lower()
            hay = (
                *(msg.content for msg in traj.messages),
                *(c.arguments for msg in traj.messages for c in msg.tool_calls),
                *(f"{c.name} {c.arguments}\n{c.output}\n{c.detail}" for c in traj.tool_calls),
                *traj.actions,
                *(e.message for e in traj.errors),
            )
            if not any(needle in h.lower() for h in hay):
                return False
        return True


def _has_errors(traj: Trajectory) -> bool:
    return (
        bool(traj.errors) or traj.infra_failure or any(c.status is not ToolStatus.OK for c in traj.tool_calls)
    )


def filter(trajectories: Iterable[Trajectory], **criteria: Any) -> list[Trajectory]:
    """The trajectories matching every criterion of :class:`Filter` (``step=``, ``grep=``, ...)."""
    f = Filter(**criteria)
    return [t for t in trajectories if f.matches(t)]


def select(run: Run, **criteria: Any) -> list[int]:
    """Indices (file order) of ``run``'s trajectories matching every criterion of :class:`Filter`."""
    f = Filter(**criteria)
    return [i for i, t in enumerate(run.trajectories) if f.matches(t)]
