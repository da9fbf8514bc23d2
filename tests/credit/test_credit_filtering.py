"""Each estimator under dynamic sampling's filter, on hand-built groups.

The NeMo-RL bug: a filter combined with a leave-one-out baseline kept groups of identical winners (the filter
looked at other members than the baseline did), whose advantages were then zero. Here the verdict is taken
on the members the estimator sees (infra failures out), so every kept group has a nonzero advantage under
OTB, GRPO, RLOO and OPO, and the zero-variance groups it drops would have got none from GRPO, RLOO and OPO.
OTB is the exception on purpose: its ``zero_tail`` rule gives the unique longest member's solo tail baseline
0, so an all-solved group of unequal lengths keeps advantage 1 there; the filter drops it anyway (no
group-relative signal). OTB on the kept groups equals its loop reference.

Groups, as (reward, model tokens) per member; ``X`` marks an infra failure (its reward means nothing)::

    a  signal          (1, 3) (0, 5) (1, 2) (0, 4)
    b  winners         (1, 3) (1, 6) (1, 2) (1, 3)       zero variance, unequal lengths
    c  losers          (0, 4) (0, 4) (0, 1) (0, 2)       zero variance
    d  winners + X     (1, 3) (1, 2) (1, 5) X(0, 3)      zero variance among the usable (raw rewards vary)
    e  one usable      (1, 3) X(0, 2) X(0, 2) X(1, 4)    too few usable
    f  signal + X      (0.5, 2) (1, 3) (0.5, 4) X(1, 1)
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from agentrl.batch import collate
from agentrl.credit import GRPO, OPO, OTB, RLOO
from agentrl.dynamic_sampling import GroupVerdict, group_verdict
from agentrl.groups import TrajectoryGroup
from agentrl.types import (
    EpisodeFailure,
    Message,
    Segment,
    StopReason,
    TokenSource,
    Trajectory,
    TrajectoryMeta,
)

from .credit_data import energy_pair
from .otb_reference import tir_otb_loop

GROUPS = {
    "a": [(1, 3), (0, 5), (1, 2), (0, 4)],
    "b": [(1, 3), (1, 6), (1, 2), (1, 3)],
    "c": [(0, 4), (0, 4), (0, 1), (0, 2)],
    "d": [(1, 3), (1, 2), (1, 5), ("X", 0, 3)],
    "e": [(1, 3), ("X", 0, 2), ("X", 0, 2), ("X", 1, 4)],
    "f": [(0.5, 2), (1, 3), (0.5, 4), ("X", 1, 1)],
}
VERDICTS = {
    "a": GroupVerdict.SIGNAL,
    "b": GroupVerdict.ZERO_VARIANCE,
    "c": GroupVerdict.ZERO_VARIANCE,
    "d": GroupVerdict.ZERO_VARIANCE,
    "e": GroupVerdict.TOO_FEW_USABLE,
    "f": GroupVerdict.SIGNAL,
}
ESTIMATORS = [OTB(), OTB(zero_tail=False), GRPO(), GRPO(norm_by_std=False), RLOO(), OPO()]


def _traj(group: str, i: int, spec: tuple) -> Trajectory:
    infra = spec[0] == "X"
    reward, n = (spec[1], spec[2]) if infra else spec
    prompt = (1, 2)
    return Trajectory(
        token_ids=(*prompt, *range(10, 10 + n)),
        loss_mask=(0, 0, *([1] * n)),
        logprobs=(None, None, *([-0.5] * n)),
        segments=(Segment(TokenSource.PROMPT, 0, 2, -1, 0), Segment(TokenSource.MODEL, 2, 2 + n, 0, 1)),
        messages=(Message("user", "q"), Message("assistant", "a" * n)),
        tool_calls=(),
        actions=("a" * n,),
        rewards=(float(reward),),
        terminated=not infra,
        truncated=False,
        stop_reason=StopReason.SANDBOX_ERROR if infra else StopReason.TERMINATED,
        errors=(EpisodeFailure("SandboxError", "down", 0, True),) if infra else (),
        meta=TrajectoryMeta(
            env_id="e", seed=0, task_id=f"e:{group}", group_id=group, episode_id=f"{group}{i}"
        ),
    )


def _groups() -> dict[str, TrajectoryGroup]:
    return {g: TrajectoryGroup(tuple(_traj(g, i, s) for i, s in enumerate(m))) for g, m in GROUPS.items()}


def _advantages(est, groups: list[TrajectoryGroup], seed: int = 0):
    batch = collate(groups, pad_id=0)
    mask = batch.loss_mask_B_T.double()
    rng = random.Random(seed)
    pairs = [[energy_pair(rng.uniform(0.05, 0.95), rng.random()) for _ in range(mask.shape[1])] for _ in mask]
    lp = torch.tensor([[a for a, _ in row] for row in pairs], dtype=torch.float64)
    sp = torch.tensor([[b for _, b in row] for row in pairs], dtype=torch.float64)
    rew = batch.token_rewards_B_T.double()
    adv = est.advantages(rew, mask, lp, sp, list(batch.group_ids))
    return batch, adv, (rew, mask, lp, sp)


def test_verdicts_are_taken_on_the_usable_members():
    groups = _groups()
    assert {g: group_verdict(grp) for g, grp in groups.items()} == VERDICTS
    # Group d's raw rewards vary (the failed member's 0): a filter on them would keep identical winners.
    assert len(set(groups["d"].rewards)) == 2


@pytest.mark.parametrize("est", ESTIMATORS, ids=str)
def test_every_kept_group_has_a_nonzero_advantage(est):
    groups = _groups()
    kept = [u for g, grp in groups.items() if VERDICTS[g] is GroupVerdict.SIGNAL and (u := grp.usable())]
    batch, adv, _ = _advantages(est, kept)
    for gid in {"a", "f"}:
        rows = [i for i, g in enumerate(batch.group_ids) if g == gid]
        assert adv[rows].abs().max() > 1e-3, (str(est), gid)


@pytest.mark.parametrize("est", ESTIMATORS, ids=str)
def test_what_the_filter_drops_has_no_group_relative_signal(est):
    groups = _groups()
    dropped = [groups[g].usable() for g in ("b", "c", "d")]
    batch, adv, _ = _advantages(est, [g for g in dropped if g is not None])
    for gid in ("b", "c", "d"):
        rows = [i for i, g in enumerate(batch.group_ids) if g == gid]
        a = adv[rows]
        if isinstance(est, OTB) and est.zero_tail and gid in ("b", "d"):
            # The unique longest member's tokens past the others' lengths: baseline 0, advantage = return 1.
            longest = max(rows, key=lambda r: int(batch.loss_mask_B_T[r].sum()))
            others = [r for r in rows if r != longest]
            assert a[[rows.index(r) for r in others]].abs().max() < 1e-6
            assert a[rows.index(longest)].max() == pytest.approx(1.0)
        else:
            assert a.abs().max() < 1e-6, (str(est), gid)


@pytest.mark.parametrize("zero_tail", [True, False])
def test_otb_on_the_kept_groups_equals_its_loop_reference(zero_tail):
    groups = _groups()
    kept = [
        u for g, grp in groups.items() if group_verdict(grp) is GroupVerdict.SIGNAL and (u := grp.usable())
    ]
    assert [g.group_id for g in kept] == ["a", "f"]
    assert all(not t.infra_failure for g in kept for t in g)
    _batch, adv, (rew, mask, lp, sp) = _advantages(OTB(zero_tail=zero_tail), kept, seed=3)
    want = tir_otb_loop(rew, mask, lp, sp, list(_batch.group_ids), zero_tail=zero_tail)
    assert torch.allclose(adv, want, atol=1e-12, rtol=0)
    assert not math.isclose(float(adv.abs().sum()), 0.0)
