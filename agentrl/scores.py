"""The learner's scores of each training step, recorded so that advantages survive checkpoint rotation.

An advantage estimator that reads the policy (OTB) needs log π and Σπ² of the weights that sampled the step;
only a checkpoint of those weights could give them back, and a run keeps few checkpoints. So the trainer
writes, per step, exactly those two numbers for every model token it trained on::

    <run>/scores/step-000003.json   {"step": 3, "episodes": [{"episode_id", "logprobs", "sum_pi_squared"}]}

(values at the model tokens only, in token order, float32 values written exactly). With the recorded
rewards they are all an estimator needs: :func:`step_scores_tensors` puts them back into ``[B, T]`` tensors,
and replay recomputes the step's advantages with no weights at all. About 2 numbers per sampled token: a
few hundred KB per step of the default run, against 0.27-1.6 GB per checkpoint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.errors import StoreError
from agentrl.groups import TrajectoryGroup
from agentrl.run import RunDir
from agentrl.types import Trajectory

__all__ = ["EpisodeScores", "StepScores", "load_step_scores", "save_step_scores", "step_scores_tensors"]


@dataclass(frozen=True, slots=True)
class EpisodeScores:
    """One trained episode's scores at its model tokens (``loss_mask == 1``), in token order."""

    episode_id: str
    """``meta.episode_id`` of the trajectory."""
    logprobs: tuple[float, ...]
    """log π of each model token under the weights that sampled the step (the learner's, not the
    sampler's)."""
    sum_pi_squared: tuple[float, ...]
    """Σπ² of the distribution at each model token."""
    sample_index: int = 0
    """``meta.sample_index`` of the trajectory (a multi-sample episode has one record per sample)."""


@dataclass(frozen=True, slots=True)
class StepScores:
    """The scores a training step computed before its update."""

    step: int
    """The training step."""
    episodes: tuple[EpisodeScores, ...]
    """The episodes it trained on, in batch order."""

    def by_episode(self) -> dict[tuple[str, int], EpisodeScores]:
        """The records by (episode id, sample index): a trajectory's key."""
        return {(e.episode_id, e.sample_index): e for e in self.episodes}


def save_step_scores(
    run: RunDir,
    step: int,
    groups: Sequence[TrajectoryGroup],
    logprobs_B_T: torch.Tensor,
    sum_pi_squared_B_T: torch.Tensor,
) -> None:
    """Write the scores of ``step`` (rows of the tensors = members of ``groups``, group after group)."""
    trajs = [t for g in groups for t in g]
    lp, sp = logprobs_B_T.detach().float().cpu(), sum_pi_squared_B_T.detach().float().cpu()
    episodes = []
    for b, t in enumerate(trajs):
        at = [i for i, m in enumerate(t.loss_mask) if m == 1]
        episodes.append(
            {
                "episode_id": t.meta.episode_id,
                "logprobs": lp[b, at].tolist(),
                "sum_pi_squared": sp[b, at].tolist(),
            }
            | ({"sample_index": t.meta.sample_index} if t.meta.sample_index else {})
        )
    path = run.scores_path(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"step": step, "episodes": episodes}, separators=(",", ":")))
    os.replace(tmp, path)  # a resumed step that is redone replaces its scores whole


def load_step_scores(run: RunDir, step: int) -> StepScores | None:
    """The recorded scores of ``step``; None when the run has none (written before they were recorded, or
    the step made no update)."""
    path = run.scores_path(step)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        episodes = tuple(
            EpisodeScores(
                str(e["episode_id"]),
                tuple(float(x) for x in e["logprobs"]),
                tuple(float(x) for x in e["sum_pi_squared"]),
                int(e.get("sample_index", 0)),
            )
            for e in data["episodes"]
        )
        return StepScores(int(data["step"]), episodes)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StoreError(f"{path} is unreadable: {e}") from e


def step_scores_tensors(
    scores: StepScores, trajectories: Sequence[Trajectory], length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs_B_T, sum_pi_squared_B_T)`` for ``trajectories`` (batch rows) padded to ``length``, 0 off
    the model tokens, as the learner returned them. Raises :class:`StoreError` when an episode has no
    recorded scores or its token count does not match the record."""
    by_id = scores.by_episode()
    lp = torch.zeros(len(trajectories), length)
    sp = torch.zeros(len(trajectories), length)
    for b, t in enumerate(trajectories):
        rec = by_id.get((t.meta.episode_id, t.meta.sample_index))
        at = [i for i, m in enumerate(t.loss_mask) if m == 1]
        if rec is None or len(rec.logprobs) != len(at) or len(rec.sum_pi_squared) != len(at):
            why = "has no scores" if rec is None else "has scores for a different number of tokens"
            raise StoreError(f"step {scores.step}: episode {t.meta.episode_id} {why} in the record")
        lp[b, at] = torch.tensor(rec.logprobs, dtype=torch.float32)
        sp[b, at] = torch.tensor(rec.sum_pi_squared, dtype=torch.float32)
    return lp, sp
