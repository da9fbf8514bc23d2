"""One episode, several samples: records, groups of episodes, the store, resume, dynamic sampling, collate.

An episode whose context was compacted (or that ran sub-agents) is several trajectories that share
``meta.episode_id`` and carry ``sample_index`` 0..n-1 and ``num_samples`` n; a group's members are episodes.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from agentrl import JsonlStore, TrajectoryGroup, TrajectoryMeta, group_trajectories, read_groups
from agentrl.batch import collate
from agentrl.credit import OTB, optimal_token_baseline
from agentrl.dynamic_sampling import GroupVerdict, group_verdict
from agentrl.errors import ConfigError, SchemaError
from agentrl.types import StopReason, Trajectory

from .test_store import tool_trajectory


def sample(group: str, episode: str, k: int = 0, n: int = 1, *, reward: float = 1.0, infra: bool = False):
    """Sample ``k`` of ``n`` of ``episode`` (the real tool trajectory of the store tests, re-labelled)."""
    t = tool_trajectory(reward=reward, group=group)
    meta = dataclasses.replace(t.meta, episode_id=episode, sample_index=k, num_samples=n)
    stop = StopReason.SANDBOX_ERROR if infra else t.stop_reason
    return dataclasses.replace(t, meta=meta, stop_reason=stop)


def episode(group: str, name: str, rewards: list[float], **kw) -> list[Trajectory]:
    return [sample(group, name, k, len(rewards), reward=r, **kw) for k, r in enumerate(rewards)]


def keys(groups) -> list[list[tuple[str, int]]]:
    return [[(t.meta.episode_id, t.meta.sample_index) for t in g] for g in groups]


# --------------------------------------------------------------------------------------------- records
def test_meta_fields_round_trip_and_old_records_load_as_single_sample():
    m = TrajectoryMeta(episode_id="e", sample_index=1, num_samples=3)
    d = m.to_dict()
    assert (d["sample_index"], d["num_samples"]) == (1, 3)
    assert TrajectoryMeta.from_dict(d) == m
    # A single-sample episode's line is what it was before the fields existed, and such lines load.
    single = TrajectoryMeta(episode_id="e").to_dict()
    assert "sample_index" not in single and "num_samples" not in single
    assert TrajectoryMeta.from_dict(single).num_samples == 1
    t = sample("g", "e", 2, 3)
    assert Trajectory.from_dict(json.loads(t.to_json())) == t
    with pytest.raises(ConfigError, match="sample_index 3 is outside"):
        TrajectoryMeta(sample_index=3, num_samples=3)
    with pytest.raises(ConfigError, match="outside"):
        TrajectoryMeta(num_samples=0)


# ---------------------------------------------------------------------------------------------- groups
def test_a_group_of_episodes_counts_and_scores_episodes():
    g = TrajectoryGroup(
        [*episode("g", "a", [0.25, 0.5]), sample("g", "b", reward=0.0), *episode("g", "c", [0, 0, 1])]
    )
    assert len(g) == 6 and g.num_episodes == 3
    assert [len(e) for e in g.episodes] == [2, 1, 3]
    # Each sample's reward is its own turns'; the episode's return is the sum over its samples.
    assert g.rewards == (0.75, 0.0, 1.0)


def test_an_infra_failure_in_one_sample_drops_the_whole_episode():
    bad = episode("g", "a", [0.0, 1.0])
    bad[1] = dataclasses.replace(bad[1], stop_reason=StopReason.SANDBOX_ERROR)
    g = TrajectoryGroup([*bad, sample("g", "b"), *episode("g", "c", [1.0, 0.0])])
    assert g.infra_failures == 1
    u = g.usable()
    assert u is not None and keys([u]) == [[("b", 0), ("c", 0), ("c", 1)]] and u.num_episodes == 2


@pytest.mark.parametrize(
    ("members", "error"),
    [
        (lambda: episode("g", "a", [1, 1, 1])[:2], "needs its 3 samples"),  # a sample missing
        (lambda: episode("g", "a", [1, 1])[::-1], "in order"),  # out of order
        (
            lambda: [*episode("g", "a", [1, 1])[:1], sample("g", "b"), *episode("g", "a", [1, 1])[1:]],
            "consecutive",
        ),
        (lambda: [*episode("g", "a", [1, 1]), *episode("g", "a", [1, 1])], "appears twice"),
        (lambda: episode("g", "", [1, 1]), "needs a meta.episode_id"),
    ],
)
def test_a_group_refuses_partial_or_jumbled_episodes(members, error):
    with pytest.raises(ConfigError, match=error):
        TrajectoryGroup(members())


def test_read_groups_rebuilds_split_episodes_from_interleaved_lines(tmp_path):
    """Samples are written as they finish, interleaved with other groups' lines; a group completes when
    its episodes (not its lines) are all there."""
    a0, a1 = episode("A", "a", [0.0, 1.0])
    b0, b1, b2 = episode("B", "b", [0.0, 0.0, 1.0])
    stream = [a0, sample("B", "b-solo"), b1, sample("A", "a-solo"), b0, a1, b2]
    path = tmp_path / "trajectories.jsonl"
    with JsonlStore(path) as store:
        for t in stream:
            store.write(t)
    for groups in (list(read_groups(path)), list(group_trajectories(stream))):
        # Members in the order they completed; a split episode's samples in sampling order.
        assert keys(groups) == [
            [("a-solo", 0), ("a", 0), ("a", 1)],
            [("b-solo", 0), ("b", 0), ("b", 1), ("b", 2)],
        ]
        assert [g.num_episodes for g in groups] == [2, 2]
    sized = list(read_groups(path, size=2))
    assert keys(sized) == keys(group_trajectories(stream))
    with pytest.raises(SchemaError, match="more than 1 members"):
        list(group_trajectories(stream, size=1))


def test_resume_never_keeps_a_partial_episode(tmp_path):
    """A crash between the lines of an episode's samples: reading the file back (as a resumed run does)
    drops the partial episode, and a group that needed it is not complete."""
    path = tmp_path / "trajectories.jsonl"
    a0, a1 = episode("A", "a", [0.0, 1.0])
    b0, _b1 = episode("B", "b", [0.0, 1.0])
    with JsonlStore(path) as store:
        for t in (sample("A", "a-solo"), a0, a1, sample("B", "b-solo"), b0):  # b's sample 1 never written
            store.write(t)
    with path.open("a") as fh:
        fh.write('{"token_ids": [1, 2')  # and a torn line after it
    assert keys(read_groups(path, size=2)) == [[("a-solo", 0), ("a", 0), ("a", 1)]]
    assert keys(read_groups(path)) == [[("a-solo", 0), ("a", 0), ("a", 1)], [("b-solo", 0)]]
    only_partial = [b0]
    assert list(group_trajectories(only_partial)) == []
    with pytest.raises(SchemaError, match="twice"):
        list(group_trajectories([a0, a0]))
    with pytest.raises(SchemaError, match="disagree"):
        list(
            group_trajectories(
                [a0, dataclasses.replace(a1, meta=dataclasses.replace(a1.meta, num_samples=3))]
            )
        )


# ----------------------------------------------------------------------------------- dynamic sampling
def test_dynamic_sampling_judges_episode_returns_and_drops_all_samples():
    # Per-sample rewards differ (0 vs 1) but both episodes return 1: zero variance, the whole group goes.
    flat = TrajectoryGroup([*episode("g", "a", [0.0, 1.0]), *episode("g", "b", [1.0, 0.0])])
    assert group_verdict(flat) is GroupVerdict.ZERO_VARIANCE
    # Per-sample rewards look varied only across samples of one episode; two episodes' returns differ.
    signal = TrajectoryGroup([*episode("g", "a", [0.0, 0.0]), *episode("g", "b", [0.0, 1.0])])
    assert group_verdict(signal) is GroupVerdict.SIGNAL
    # One episode of four samples is one member: too few for a baseline.
    one = TrajectoryGroup(episode("g", "a", [0.0, 1.0, 0.0, 1.0]))
    assert group_verdict(one) is GroupVerdict.TOO_FEW_USABLE


# -------------------------------------------------------------------------------------------- collate
def test_collate_numbers_episodes_and_places_rewards_per_sample():
    empty = dataclasses.replace(
        sample("g", "a", 1, 3, reward=0.5),
        token_ids=(1, 2, 3),
        loss_mask=(0, 0, 0),
        logprobs=(None, None, None),
        segments=(),
    )
    a = [sample("g", "a", 0, 3, reward=0.25), empty, sample("g", "a", 2, 3, reward=1.0)]
    g = TrajectoryGroup([*a, sample("g", "b", reward=0.0), *episode("g", "c", [0.0, 1.0])])
    h = TrajectoryGroup([sample("h", "d", reward=1.0)])
    batch = collate([g, h], pad_id=0)
    assert batch.episode_ids == (0, 0, 0, 1, 2, 2, 3)
    # Each sample's reward on its own last model token; the empty sample's 0.5 goes to the one before.
    assert batch.token_rewards_B_T.sum(dim=1).tolist() == [0.75, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert batch.select([3, 0]).episode_ids == (1, 0)
    # Single-sample batches keep no episode ids (every row is its own episode, as before).
    assert collate([h, TrajectoryGroup([sample("k", "x"), sample("k", "y")])], pad_id=0).episode_ids == ()


def test_collated_split_episodes_get_otb_across_samples():
    g = TrajectoryGroup([*episode("g", "a", [0.0, 1.0]), sample("g", "b", reward=0.0), sample("g", "c")])
    batch = collate([g], pad_id=0)
    B, T = batch.loss_mask_B_T.shape
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(B, T, generator=gen) * 0.9 + 0.05
    lp, spi2 = p.log(), p * p + 0.3 * (1 - p) ** 2
    args = (batch.token_rewards_B_T, batch.loss_mask_B_T, lp, spi2, batch.group_ids)
    adv = OTB().advantages(*args, episode_ids=batch.episode_ids_or_none)
    assert torch.equal(adv, optimal_token_baseline(*args, episode_ids=[0, 0, 1, 2]))
    # Episode a's first sample (5 model tokens) sees the return its second sample earned.
    m = batch.loss_mask_B_T.bool()
    assert not torch.equal(adv, OTB().advantages(*args))
    assert (adv[0][m[0]] != 0).any()


# ------------------------------------------------------------------------------------------- staleness
def test_staleness_is_per_sample_and_the_bound_per_episode():
    from agentrl.staleness import episode_staleness, oldest_version, trajectory_staleness

    s0, s1 = episode("g", "a", [0.0, 1.0])
    s0 = dataclasses.replace(s0, meta=dataclasses.replace(s0.meta, policy_version=2))
    s1 = dataclasses.replace(s1, meta=dataclasses.replace(s1.meta, policy_version=4))
    assert [trajectory_staleness(t, 5) for t in (s0, s1)] == [3, 1]
    assert episode_staleness((s0, s1), 5) == 3  # the episode is as stale as its oldest sample
    g = TrajectoryGroup([s0, s1, sample("g", "b")])  # b: version 3
    assert oldest_version(g) == 2  # what admission checks the bound on: every sample of every episode
    with pytest.raises(ConfigError):
        episode_staleness((), 5)


# ------------------------------------------------------------------------------------------ step metrics
def test_step_metrics_are_per_episode() -> None:
    """A step's rollout metrics count a multi-sample episode once, its samples' rewards and tokens summed."""
    from agentrl.trainers.step_metrics import episode_metrics

    split = episode("g", "a", [0.0, 1.0])  # returns 1 over two samples of 5 model tokens each
    single = [sample("g", "b", reward=0.0), sample("g", "c", reward=1.0)]
    m = episode_metrics([split[0], *single, split[1]])
    assert m["episodes/total"] == 3.0
    assert m["reward/mean"] == 2 / 3 and m["reward/pass_rate"] == 2 / 3
    assert m["tokens/model_per_episode"] == (10 + 5 + 5) / 3
    assert m["turns/per_episode"] == (4 + 2 + 2) / 3
    assert m["tools/calls_per_episode"] == (2 + 1 + 1) / 3
    # A failed sample fails its episode (counted, not averaged in).
    bad = [split[0], dataclasses.replace(split[1], stop_reason=StopReason.SANDBOX_ERROR)]
    m = episode_metrics([*bad, *single])
    assert (m["episodes/total"], m["episodes/infra_failures"], m["reward/mean"]) == (3.0, 1.0, 0.5)
    # Single-sample steps: exactly as before (one trajectory, one episode).
    assert episode_metrics(single)["episodes/total"] == 2.0
    assert episode_metrics(single)["episodes/samples_per_episode"] == 1.0


def test_samples_per_episode_counts_every_episode() -> None:
    """4 samples over 2 episodes (3 + 1), and a failed episode's samples still count as samples."""
    from agentrl.trainers.step_metrics import episode_metrics

    three = episode("g", "a", [0.0, 0.0, 1.0])
    m = episode_metrics([*three, sample("g", "b")])
    assert (m["episodes/total"], m["episodes/samples_per_episode"]) == (2.0, 2.0)
    failed = episode("g", "c", [0.0, 0.0], infra=True)
    m = episode_metrics([*three, *failed, sample("g", "b")])
    assert (m["episodes/total"], m["episodes/infra_failures"]) == (3.0, 1.0)
    assert m["episodes/samples_per_episode"] == 6 / 3


def test_token_limit_warning_counts_episodes_by_their_last_sample() -> None:
    """Compacted samples end by design: two episodes of three samples, one cut at max_total_tokens at the
    end, are one cut episode of two (no warning), though one sample in six is cut; two cut of two warn."""
    from agentrl.episode import RolloutConfig
    from agentrl.trainers.step_metrics import token_limit_warning

    def ep(name: str, last: StopReason) -> list[Trajectory]:
        samples = episode("g", name, [0.0, 0.0, 0.0])
        ends = [StopReason.COMPACTED, StopReason.COMPACTED, last]
        return [dataclasses.replace(t, stop_reason=s) for t, s in zip(samples, ends, strict=True)]

    cfg = RolloutConfig(max_total_tokens=256)
    one_cut = [*ep("a", StopReason.MAX_TOKENS), *ep("b", StopReason.TERMINATED)]
    assert token_limit_warning(one_cut, cfg) is None
    warning = token_limit_warning([*ep("a", StopReason.MAX_TOKENS), *ep("b", StopReason.MAX_TOKENS)], cfg)
    assert warning is not None and "2 of 2 episodes" in warning
