"""Helpers for the replay tests: copy a run directory with edits (corruptions) applied."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.replay import Run
from agentrl.types import Segment, TokenSource, ToolStatus, Trajectory


def copy_run(
    src: Path,
    dst: Path,
    *,
    checkpoints: bool | set[int] = True,
    edit: Callable[[int, dict[str, Any]], dict[str, Any] | None] | None = None,
    edit_metrics: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Path:
    """Copy a run directory, optionally editing trajectory lines (``edit(index, record)``), metrics rows,
    and keeping only some checkpoints (``checkpoints={1}``) or none (``False``)."""
    dst.mkdir(parents=True)
    shutil.copy(src / "config.json", dst / "config.json")
    lines = (src / "trajectories.jsonl").read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if edit is not None:
            rec = edit(i, rec) or rec
        out.append(json.dumps(rec))
    (dst / "trajectories.jsonl").write_text("".join(x + "\n" for x in out))
    rows = [json.loads(x) for x in (src / "metrics.jsonl").read_text().splitlines()]
    if edit_metrics is not None:
        rows = [edit_metrics(r) for r in rows]
    (dst / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if checkpoints:
        for ck in sorted((src / "checkpoints").iterdir()):
            step = int(ck.name.split("-")[1])
            if checkpoints is True or step in checkpoints:
                (dst / "checkpoints").mkdir(exist_ok=True)
                (dst / "checkpoints" / ck.name).symlink_to(ck, target_is_directory=True)
    return dst


def first_model_segment(t: Trajectory) -> Segment:
    """The first turn the model sampled."""
    return next(s for s in t.segments if s.source is TokenSource.MODEL)


def with_tool_error(run: Run) -> int:
    """Position of the first trajectory with a failed tool call."""
    return next(
        i for i, t in enumerate(run.trajectories) if any(c.status is ToolStatus.ERROR for c in t.tool_calls)
    )


def with_ok_tool(run: Run) -> int:
    """Position of the first trajectory that used the tool and won."""
    return next(
        i
        for i, t in enumerate(run.trajectories)
        if any(c.status is ToolStatus.OK for c in t.tool_calls) and t.reward == 1.0
    )
