"""One record per fact: per-turn policy versions live in ``Trajectory.policy_versions`` and Ray provenance in
``TrajectoryMeta.provenance``; every trajectory is built by ``build_trajectory``; files written before (the
facts as ``meta.extra`` strings) still load into the typed fields."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agentrl import JsonlStore, read_trajectories
from agentrl.errors import AuditError, FormatError
from agentrl.masking import Piece, build_trajectory
from agentrl.replay.terminal import render
from agentrl.staleness import token_versions
from agentrl.types import Provenance, StopReason, TokenSource, Trajectory, TrajectoryMeta
from tests.core.test_store import tool_trajectory

PROV = Provenance("worker-1", "server-0", "node-a", "worker-1@node-a/pid7", episode_attempts=2)


def spanning() -> Trajectory:
    """The store test's two-turn trajectory, its turns sampled by versions 3 and 4, run on Ray."""
    t = tool_trajectory()
    return dataclasses.replace(t, meta=dataclasses.replace(t.meta, provenance=PROV), policy_versions=(3, 4))


def test_new_format_round_trips_through_the_store(tmp_path):
    t = spanning()
    t.validate()
    with JsonlStore(tmp_path / "t.jsonl") as store:
        store.write(t)
        store.write(tool_trajectory())  # one process: no provenance written
    back = list(read_trajectories(tmp_path / "t.jsonl"))
    assert back == [t, tool_trajectory()]
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert lines[0]["policy_versions"] == [3, 4] and lines[0]["meta"]["provenance"] == PROV.to_dict()
    assert lines[0]["meta"]["extra"] == {"difficulty": 2}  # the facts are not written twice
    assert "provenance" not in lines[1]["meta"]
    assert (back[0].min_policy_version, back[0].max_policy_version) == (3, 4)


def old_line() -> dict:
    """A line as the previous release wrote a Ray episode that spanned versions 3 and 4: versions and
    provenance as ``meta.extra`` strings, no ``policy_versions``, no ``meta.provenance``."""
    d = tool_trajectory().to_dict()
    del d["policy_versions"]
    d["meta"]["extra"] = {
        "difficulty": 2,
        "policy_version_max": 4,
        "turn_versions": "3,4",
        "worker": "worker-1",
        "server": "server-0",
        "node": "node-a",
        "sandbox_pool": "worker-1@node-a/pid7",
        "episode_attempts": "2",
    }
    return {"schema_version": 1, **d}


def test_old_files_load_into_the_typed_fields(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old_line()) + "\n")
    (t,) = list(read_trajectories(path))
    assert t == spanning()
    assert t.policy_versions == (3, 4) and t.meta.provenance == PROV
    assert dict(t.meta.extra) == {"difficulty": 2}
    assert token_versions(t)[9:] == (4, 4)  # the second turn's tokens: its own version, not the oldest


def test_a_users_own_extra_keys_are_not_taken_for_provenance():
    d = tool_trajectory().to_dict()
    d["meta"]["extra"] = {"node": "n1", "worker": "w"}  # not the worker's four keys: the user's data
    t = Trajectory.from_dict(d)
    assert t.meta.provenance is None and dict(t.meta.extra) == {"node": "n1", "worker": "w"}


def test_bad_provenance_gets_a_clear_error():
    d = tool_trajectory().to_dict()
    d["meta"]["provenance"] = {"worker": "w", "server": "s", "node": "n"}
    with pytest.raises(FormatError, match="provenance needs worker, server, node, sandbox_pool"):
        Trajectory.from_dict(d)
    with pytest.raises(FormatError, match="episode_attempts >= 1"):
        Provenance("w", "s", "n", "p", episode_attempts=0)


def _pieces() -> list[Piece]:
    """prompt [1 2] | model turn 0 [3 4] | observation [5] | model turn 1 [6]."""
    return [
        Piece(TokenSource.PROMPT, (1, 2), -1, 0),
        Piece.sampled((3, 4), (-0.5, -0.25), 0, 1),
        Piece(TokenSource.OBSERVATION, (5,), 0, 2),
        Piece.sampled((6,), (-1.0,), 1, 3),
    ]


def _build(versions, pieces=None):
    return build_trajectory(
        _pieces() if pieces is None else pieces,
        messages=(),
        meta=TrajectoryMeta(policy_version=9),
        rewards=(0.0, 1.0),
        stop_reason=StopReason.TERMINATED,
        terminated=True,
        truncated=False,
        versions=versions,
    )


def test_build_trajectory_records_each_turns_version_once():
    t = _build([5, 6])
    t.validate()
    assert t.policy_versions == (5, 6) and t.meta.policy_version == 5 and t.meta.extra == {}
    assert t.token_ids == (1, 2, 3, 4, 5, 6) and t.loss_mask == (0, 0, 1, 1, 0, 1)
    assert token_versions(t) == (5, 5, 5, 5, 5, 6)
    fixed = _build(None)  # a sampler without weight updates: every turn has meta.policy_version
    assert fixed.policy_versions == (9, 9) and fixed.meta.policy_version == 9
    none = _build([], pieces=_pieces()[:1])  # no model turn: the version served at the start stays
    assert none.policy_versions == () and none.meta.policy_version == 9
    with pytest.raises(AuditError, match="1 policy versions given for 2 model turns"):
        _build([5])


def test_the_viewer_shows_versions_and_provenance():
    text = render(spanning(), color=False)
    assert "policy v3-4 (per turn 3, 4)" in text
    assert "ran on worker-1 on node node-a, server-0, sandbox pool worker-1@node-a/pid7 (2 attempts)" in text
    assert "ran on" not in render(tool_trajectory(), color=False)
