"""collate: TrajectoryGroups → TokenBatch."""

from __future__ import annotations

import pytest
import torch

from agentrl.batch import TokenBatch, collate
from agentrl.errors import AuditError, ConfigError
from agentrl.groups import group_trajectories
from agentrl.types import (
    EpisodeFailure,
    Message,
    Segment,
    StopReason,
    TokenSource,
    Trajectory,
    TrajectoryMeta,
)


def traj(parts, reward=1.0, group="g0", stop=StopReason.TERMINATED, errors=(), eid="e"):
    """parts: list of (source, token ids); model tokens get log-prob -0.5·(index+1)."""
    ids, mask, lps, segs = [], [], [], []
    turn = -1
    for src, toks in parts:
        start = len(ids)
        if src is TokenSource.MODEL:
            turn += 1
        for t in toks:
            ids.append(t)
            mask.append(1 if src is TokenSource.MODEL else 0)
            lps.append(-0.5 * (len(ids)) if src is TokenSource.MODEL else None)
        segs.append(Segment(src, start, len(ids), turn))
    return Trajectory(
        token_ids=tuple(ids),
        loss_mask=tuple(mask),
        logprobs=tuple(lps),
        segments=tuple(segs),
        messages=(Message("user", "hi"),),
        rewards=(reward,),
        stop_reason=stop,
        errors=tuple(errors),
        meta=TrajectoryMeta(group_id=group, episode_id=eid),
    )


P, M, OBS = TokenSource.PROMPT, TokenSource.MODEL, TokenSource.OBSERVATION


def test_collate_layout():
    a = traj([(P, [5, 6]), (M, [7, 8]), (OBS, [9]), (M, [10]), (OBS, [11, 12])], reward=2.0)
    b = traj([(P, [1]), (M, [2, 3])], reward=-1.0, group="g1")
    for t in (a, b):
        t.validate()
    batch = collate(list(group_trajectories([a, b])), pad_id=0)
    assert isinstance(batch, TokenBatch)
    assert batch.input_ids_B_T.tolist() == [[5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 0, 0, 0, 0, 0]]
    assert batch.attention_mask_B_T.tolist() == [[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0]]
    assert batch.loss_mask_B_T.tolist() == [[0, 0, 1, 1, 0, 1, 0, 0], [0, 1, 1, 0, 0, 0, 0, 0]]
    assert batch.old_logprobs_B_T[0].tolist() == [0, 0, -1.5, -2.0, 0, -3.0, 0, 0]
    # Reward on the last *model* token, even when observation tokens follow it.
    assert batch.token_rewards_B_T.tolist() == [[0, 0, 0, 0, 0, 2.0, 0, 0], [0, 0, -1.0, 0, 0, 0, 0, 0]]
    assert batch.group_ids == ("g0", "g1")
    assert batch.lengths_B.tolist() == [8, 3]
    assert batch.num_model_tokens == 5
    assert batch.loss_mask_B_T.dtype == torch.float32
    sub = batch.select([1])
    assert sub.seq_len == 3 and sub.group_ids == ("g1",)
    with pytest.raises(AttributeError):
        batch.group_ids = ()  # type: ignore[misc]


def test_infra_failures_are_refused():
    ok = traj([(P, [1]), (M, [2])])
    bad = traj([(P, [1]), (M, [2])], stop=StopReason.SANDBOX_ERROR, eid="boom")
    with pytest.raises(ConfigError, match=r"infra failure.*boom"):
        collate(list(group_trajectories([ok, bad])), pad_id=0)
    bad2 = traj([(P, [1]), (M, [2])], errors=[EpisodeFailure("PolicyError", "down", 0, True)], eid="x")
    with pytest.raises(ConfigError, match="infra"):
        collate(list(group_trajectories([bad2])), pad_id=0)


def test_broken_trajectories():
    with pytest.raises(ConfigError):
        collate(list(group_trajectories([])), pad_id=0)
    t = traj([(P, [1]), (M, [2])])
    broken = Trajectory(
        token_ids=t.token_ids,
        loss_mask=(0, 1),
        logprobs=(None, None),
        segments=t.segments,
        messages=t.messages,
    )
    with pytest.raises(AuditError, match="log-prob"):
        collate(list(group_trajectories([broken])), pad_id=0)
    short = Trajectory(token_ids=(1, 2, 3), loss_mask=(0, 1), logprobs=(None, -1.0), segments=(), messages=())
    with pytest.raises(AuditError):
        collate(list(group_trajectories([short])), pad_id=0)


def test_no_model_tokens_keeps_no_reward():
    t = traj([(P, [1, 2])], reward=5.0)
    batch = collate(list(group_trajectories([t])), pad_id=0)
    assert batch.token_rewards_B_T.abs().sum() == 0
