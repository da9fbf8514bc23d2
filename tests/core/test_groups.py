"""TrajectoryGroup: built once, streamed back from a trajectory file (old files too), collated by group."""

import dataclasses
import json

import pytest

from agentrl import JsonlStore, TrajectoryGroup, group_trajectories, read_groups
from agentrl.errors import ConfigError, SchemaError
from agentrl.store import REQUIRED_KEYS
from agentrl.types import StopReason

from .test_store import tool_trajectory


def member(group: str, episode: str, *, task: str = "t", reward: float = 1.0, infra: bool = False):
    t = tool_trajectory(reward=reward, group=group)
    meta = dataclasses.replace(t.meta, episode_id=episode, task_id=task)
    stop = StopReason.SANDBOX_ERROR if infra else t.stop_reason
    return dataclasses.replace(t, meta=meta, stop_reason=stop)


def ids(groups) -> list[list[str]]:
    return [[t.meta.episode_id for t in g] for g in groups]


def test_a_group_is_validated_and_knows_its_members():
    g = TrajectoryGroup([member("g", "a", reward=1.0), member("g", "b", reward=0.0, infra=True)])
    assert isinstance(g.trajectories, tuple) and len(g) == 2 and g[0].meta.episode_id == "a"
    assert (g.group_id, g.task_id, g.rewards, g.infra_failures) == ("g", "t", (1.0, 0.0), 1)
    assert ids([g.usable()]) == [["a"]]
    assert TrajectoryGroup((member("g", "a"),)).usable().trajectories == (member("g", "a"),)
    assert TrajectoryGroup((member("g", "x", infra=True),)).usable() is None
    with pytest.raises(ConfigError, match="non-empty"):
        TrajectoryGroup(())
    with pytest.raises(ConfigError, match="share group_id"):
        TrajectoryGroup((member("g", "a"), member("h", "b")))
    with pytest.raises(ConfigError, match="share group_id and task_id"):
        TrajectoryGroup((member("g", "a"), member("g", "b", task="other")))


def test_episodes_are_gathered_in_any_order_by_group_and_episode():
    from agentrl.groups import episode_returns, episodes_of

    def sample(group: str, episode: str, k: int, n: int, **kw):
        t = member(group, episode, **kw)
        return dataclasses.replace(t, meta=dataclasses.replace(t.meta, sample_index=k, num_samples=n))

    # Samples out of order, two groups reusing an episode id, and single-sample trajectories sharing an id:
    # a multi-sample episode is (group, episode id); a single sample is an episode of its own.
    stream = [
        sample("A", "e", 1, 2, reward=0.5),
        member("A", "s"),
        sample("B", "e", 0, 2),
        sample("A", "e", 0, 2, reward=0.25),
        member("A", "s", reward=0.0, infra=True),
        sample("B", "e", 1, 2),
    ]
    got = episodes_of(stream)
    assert [[(t.meta.group_id, t.meta.sample_index) for t in e] for e in got] == [
        [("A", 0), ("A", 1)],
        [("A", 0)],
        [("B", 0), ("B", 1)],
        [("A", 0)],
    ]
    assert episode_returns(stream) == [0.75, 1.0, 2.0]  # the infra failure is left out


def test_grouping_a_stream_orders_groups_by_completion_and_members_by_stream():
    stream = [member("A", "a1"), member("B", "b1"), member("B", "b2"), member("C", "c1"), member("A", "a2")]
    assert ids(group_trajectories(stream)) == [["b1", "b2"], ["c1"], ["a1", "a2"]]
    # With a size: yielded the moment a group is full; a group that never fills (an interrupted step's
    # leftovers) is dropped.
    it = group_trajectories(iter(stream), size=2)
    assert ids([next(it)]) == [["b1", "b2"]]
    assert ids(it) == [["a1", "a2"]]
    with pytest.raises(SchemaError, match="more than 2 members"):
        list(group_trajectories([*stream, member("B", "b3")], size=2))
    with pytest.raises(ConfigError, match="positive int"):
        list(group_trajectories(stream, size=0))


def test_the_store_streams_groups_back_from_per_trajectory_lines(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    with JsonlStore(path) as store:
        for t in [member("A", "a1"), member("B", "b1"), member("A", "a2"), member("C", "c1")]:
            store.write(t)  # one line per episode, as each finishes
        assert ids(store.read_groups(size=2)) == [["a1", "a2"]]
    assert ids(read_groups(tmp_path)) == [["b1"], ["a1", "a2"], ["c1"]]


def test_files_of_earlier_releases_read_back_as_groups(tmp_path):
    """A line with only the keys the first schema required (group_id at the top, no meta) still groups."""
    path = tmp_path / "old.jsonl"
    lines = []
    for k, group in enumerate(["g1", "g2", "g1"]):
        full = {"schema_version": 1, **member(group, f"e{k}").to_dict()}
        lines.append(json.dumps({key: full[key] for key in (*REQUIRED_KEYS, "segments")}))
    path.write_text("\n".join(lines) + "\n")
    groups = list(read_groups(path, size=2))
    assert [g.group_id for g in groups] == ["g1"] and len(groups[0]) == 2


def test_collate_takes_groups_row_by_row():
    from agentrl.batch import collate

    a1, b1, a2 = member("A", "a1", reward=1.0), member("B", "b1", reward=0.5), member("A", "a2", reward=0.0)
    groups = list(group_trajectories([a1, b1, a2]))
    batch = collate(groups, pad_id=0)
    assert batch.group_ids == ("B", "A", "A")
    assert batch.token_rewards_B_T.sum(dim=1).tolist() == [0.5, 1.0, 0.0]
    with pytest.raises(ConfigError, match="TrajectoryGroup"):
        collate([a1, b1], pad_id=0)
    with pytest.raises(ConfigError, match="share the group id"):
        collate([TrajectoryGroup((a1,)), TrajectoryGroup((a2,))], pad_id=0)
    with pytest.raises(ConfigError, match="infra"):
        collate([TrajectoryGroup((a1, member("A", "x", infra=True)))], pad_id=0)
