"""One self-contained HTML page to browse recorded trajectories (the viewer itself is
:mod:`agentrl.replay.page`)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.replay.decode import session_label, token_text, version_label
from agentrl.replay.page import render_page
from agentrl.replay.records import Run
from agentrl.replay.reports import RecomputeReport, TrajectoryRecompute
from agentrl.types import Trajectory

__all__ = ["write_html"]


def write_html(
    run: Run | Sequence[Trajectory],
    out: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    indices: Sequence[int] | None = None,
    advantages: Mapping[int, Sequence[float | None]] | None = None,
    recomputed: RecomputeReport | None = None,
    title: str | None = None,
    max_trajectories: int = 2000,
    advantage_sources: Mapping[int, str] | None = None,
    notes: Sequence[str] = (),
) -> Path:
    """Write one self-contained HTML page (inline CSS, JS and data; no network) to browse trajectories:
    a filterable list, the transcript, tool calls, and the token stream coloured by provenance/mask,
    log-prob, advantage or recompute difference, with per-token details on hover.

    ``tokenizer`` gives the tokens their text (without one they are shown as ids; a run's own tokenizer is
    ``agentrl.trainers.replay.load_tokenizer_for(run)``). ``indices`` picks run positions (default: all; at
    most ``max_trajectories``); ``advantages`` maps a run position to per-token values
    (``agentrl.trainers.replay.step_advantages``); ``recomputed`` adds recomputed log-probs and Σπ²
    (``agentrl.trainers.replay.recompute_run``). ``advantage_sources`` says, per run position, how its
    advantages were obtained (shown with the trajectory); ``notes`` are shown at the top of the page.
    """
    if isinstance(run, Run):
        trajs = run.trajectories
        source = str(run.path)
    else:
        trajs = tuple(run)
        source = ""
    idx = list(indices) if indices is not None else list(range(len(trajs)))
    if len(idx) > max_trajectories:
        # Every token of every episode is embedded; past a few thousand episodes the page gets too big
        # for a browser to be useful.
        raise ConfigError(
            f"{len(idx)} trajectories for one page (limit {max_trajectories}): select fewer (filters such "
            "as --step, --limit) or raise max_trajectories"
        )
    tx = token_text(tokenizer)
    shown = set(idx)
    samples = _episode_samples(trajs)
    rec_by_index = {t.index: t for t in recomputed.trajectories} if recomputed is not None else {}
    vocab: dict[int, str] = {}
    items = []
    for i in idx:
        t = trajs[i]
        if tx is not None:
            for tid in set(t.token_ids):
                if tid not in vocab:
                    vocab[tid] = tx.token(tid)
        adv = advantages.get(i) if advantages is not None else None
        rc = rec_by_index.get(i)
        items.append(_traj_payload(i, t, adv, rc))
        if t.meta.num_samples > 1:
            items[-1]["ep"] = _episode_payload(t, samples, shown, trajs)
        if advantage_sources and i in advantage_sources:
            items[-1]["adv_src"] = advantage_sources[i]
    notes = list(notes)
    if tx is None:
        notes.append("no tokenizer: tokens are shown as ids")
    payload = {
        "title": title or (f"agentrl replay: {source}" if source else "agentrl replay"),
        "source": source,
        "notes": notes,
        "vocab": {str(k): v for k, v in vocab.items()},
        "trajectories": items,
        "has_advantages": advantages is not None,
        "has_recomputed": recomputed is not None,
    }
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(payload), encoding="utf-8")
    return path


def _episode_samples(trajs: Sequence[Trajectory]) -> dict[tuple[str, str], dict[int, int]]:
    """Run positions of the samples of each multi-sample episode: (group, episode) → {sample index: i}."""
    out: dict[tuple[str, str], dict[int, int]] = {}
    for i, t in enumerate(trajs):
        if t.meta.num_samples > 1:
            out.setdefault((t.meta.group_id, t.meta.episode_id), {})[t.meta.sample_index] = i
    return out


def _episode_payload(
    t: Trajectory,
    samples: Mapping[tuple[str, str], Mapping[int, int]],
    shown: set[int],
    trajs: Sequence[Trajectory],
) -> dict[str, Any]:
    """What the viewer shows of a sample's episode: each sample's run position (None: not on this page, or
    missing from the run) and the episode's return (None when a sample is missing)."""
    at = samples.get((t.meta.group_id, t.meta.episode_id), {})
    links = [[k, at[k] if k in at and at[k] in shown else None] for k in range(t.meta.num_samples)]
    complete = len(at) == t.meta.num_samples
    ret = math.fsum(trajs[j].reward for j in at.values()) if complete else None
    return {"sample": t.meta.sample_index, "samples": t.meta.num_samples, "links": links, "return": ret}


def _r(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.7g}")  # 7 significant digits: exact enough to see a 1e-6 mismatch, half the bytes


def _traj_payload(
    i: int, t: Trajectory, adv: Sequence[float | None] | None, rc: TrajectoryRecompute | None
) -> dict[str, Any]:
    m = t.meta
    return {
        "i": i,
        "id": m.episode_id,
        "env": m.env_id,
        "task": m.task_id,
        "seed": m.seed,
        "step": m.step,
        "group": m.group_id,
        "session": session_label(t),
        "pv": version_label(t),
        "ran": m.provenance.label() if m.provenance is not None else None,
        "reward": t.reward,
        "rewards": list(t.rewards),
        "stop": t.stop_reason.value,
        "terminated": t.terminated,
        "truncated": t.truncated,
        "infra": t.infra_failure,
        "turns": t.num_turns,
        "model_tokens": t.num_model_tokens,
        "errors": [e.to_dict() for e in t.errors],
        "messages": [msg.to_dict() for msg in t.messages],
        "tools": [{k: v for k, v in r.to_dict().items()} for r in t.tool_calls],
        "actions": list(t.actions),
        "segments": [[s.source.value, s.start, s.end, s.turn, s.message_index] for s in t.segments],
        "ids": list(t.token_ids),
        "mask": list(t.loss_mask),
        "lp": [_r(x) for x in t.logprobs],
        "adv": [_r(x) for x in adv] if adv is not None else None,
        "rlp": [_r(x) for x in rc.logprobs] if rc is not None else None,
        "spi2": [_r(x) for x in rc.sum_pi_squared] if rc is not None else None,
    }
