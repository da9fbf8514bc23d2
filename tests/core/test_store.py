"""The JSONL trajectory store: exact round trip, torn last line, live reading, schema checks."""

import asyncio
import json

import pytest

from agentrl import JsonlStore, read_trajectories
from agentrl.errors import SchemaError, StoreError
from agentrl.store import REQUIRED_KEYS, SCHEMA_VERSION, StoreIssue
from agentrl.types import (
    EpisodeFailure,
    Message,
    Segment,
    StopReason,
    TokenSource,
    ToolCall,
    ToolRecord,
    ToolStatus,
    Trajectory,
    TrajectoryMeta,
)


def tool_trajectory(reward: float = 1.0, group: str = "g0") -> Trajectory:
    """prompt [1 2 3] | model [4 5 6] | template [7] | tool obs [8 9] | model [10 11]."""
    call = ToolCall(id="call_0", name="python", arguments='{"code": "print(6*7)"}')
    return Trajectory(
        token_ids=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11),
        loss_mask=(0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1),
        logprobs=(None, None, None, -0.1, -0.2, -0.3, None, None, None, -1.5, -0.25),
        segments=(
            Segment(TokenSource.PROMPT, 0, 3, -1, 0),
            Segment(TokenSource.MODEL, 3, 6, 0, 1),
            Segment(TokenSource.TEMPLATE, 6, 7, 0),
            Segment(TokenSource.OBSERVATION, 7, 9, 0, 2),
            Segment(TokenSource.MODEL, 9, 11, 1, 3),
        ),
        messages=(
            Message("user", "What is 6*7? ünïcode ✓"),
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", "42\n", tool_call_id="call_0", name="python"),
            Message("assistant", "Answer: 42"),
        ),
        tool_calls=(ToolRecord("call_0", "python", call.arguments, "42\n", ToolStatus.OK, 0.0021, 0),),
        actions=('<tool_call>{"name": "python"}</tool_call>', "Answer: 42"),
        rewards=(0.0, reward),
        terminated=True,
        truncated=False,
        stop_reason=StopReason.TERMINATED,
        errors=(EpisodeFailure("ToolCallError", "bad json", 0, False),),
        meta=TrajectoryMeta(
            env_id="math-tir-v0",
            seed=7,
            task_id="t7",
            group_id=group,
            policy_version=3,
            step=2,
            episode_id="e1",
            extra={"difficulty": 2},
        ),
        timings={"generate": 0.5, "total": 0.75},
    )


def test_round_trip_is_exact(tmp_path):
    traj = tool_trajectory()
    traj.validate()
    with JsonlStore(tmp_path / "t.jsonl") as store:
        store.write(traj)
        store.write(tool_trajectory(reward=0.0, group="g1"))
    back = list(store.read())
    assert back[0] == traj
    assert back[1].reward == 0.0 and back[1].meta.group_id == "g1"
    line = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert set(REQUIRED_KEYS) <= set(line)
    assert line["schema_version"] == SCHEMA_VERSION
    assert line["logprobs"][:3] == [None, None, None]
    assert line["messages"][1]["tool_calls"][0]["function"]["name"] == "python"


async def test_async_append_and_read_while_writing(tmp_path):
    path = tmp_path / "live.jsonl"
    writer = JsonlStore(path)
    for k in range(3):
        await writer.append(tool_trajectory(group=f"g{k}"))
        # A second reader sees every flushed line while the writer still holds the file open.
        assert [t.meta.group_id for t in read_trajectories(path)] == [f"g{i}" for i in range(k + 1)]
    writer.close()


def test_torn_last_line_is_reported_and_skipped(tmp_path):
    path = tmp_path / "t.jsonl"
    with JsonlStore(path) as s:
        s.write(tool_trajectory())
        s.write(tool_trajectory(group="g1"))
    full = path.read_text()
    path.write_text(full[: len(full) - 40])  # a crash in the middle of the second line
    issues: list[StoreIssue] = []
    back = list(read_trajectories(path, issues=issues))
    assert [t.meta.group_id for t in back] == ["g0"]
    assert len(issues) == 1 and issues[0].line == 2 and "torn" in issues[0].reason


def test_reopening_a_torn_file_keeps_the_fragment_and_appends_cleanly(tmp_path):
    path = tmp_path / "t.jsonl"
    with JsonlStore(path) as s:
        s.write(tool_trajectory())
    with open(path, "a") as fh:
        fh.write('{"schema_version": 1, "token_ids": [1, 2')  # torn write
    with JsonlStore(path, mode="append") as s:
        s.write(tool_trajectory(group="after"))
    assert [t.meta.group_id for t in read_trajectories(path)] == ["g0", "after"]
    assert '"token_ids": [1, 2' in (tmp_path / "t.jsonl.torn").read_text()


def test_corrupt_middle_line_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    with JsonlStore(path) as s:
        s.write(tool_trajectory())
        s.write(tool_trajectory())
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("{broken\n" + "".join(lines))
    with pytest.raises(SchemaError, match=r"t.jsonl:1"):
        list(read_trajectories(path))


def test_newer_schema_and_missing_keys(tmp_path):
    path = tmp_path / "t.jsonl"
    rec = {"schema_version": SCHEMA_VERSION + 1, **tool_trajectory().to_dict()}
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(SchemaError, match="newer"):
        list(read_trajectories(path))
    rec = tool_trajectory().to_dict()
    rec["schema_version"] = 1
    del rec["loss_mask"]
    path.write_text(json.dumps(rec) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(SchemaError, match="missing keys"):
        list(read_trajectories(path))


def test_bad_input_gets_clear_errors(tmp_path):
    with pytest.raises(StoreError, match="only store a Trajectory"):
        JsonlStore(tmp_path / "x.jsonl").write({"token_ids": []})  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="cannot read"):
        list(read_trajectories(tmp_path / "missing.jsonl"))
    nan = tool_trajectory(reward=float("nan"))
    with pytest.raises(StoreError, match="NaN"):
        JsonlStore(tmp_path / "x.jsonl").write(nan)


def test_run_directory_path_reads_its_trajectories(tmp_path):
    with JsonlStore(tmp_path / "trajectories.jsonl") as s:
        s.write(tool_trajectory())
    assert len(list(read_trajectories(tmp_path))) == 1


def test_a_second_store_refuses_an_existing_file_unless_asked(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    first = JsonlStore(path)
    first.write(tool_trajectory(group="a"))
    first.close()
    first.write(tool_trajectory(group="b"))  # the same store reopening its own file keeps appending
    first.close()
    # A re-run script (a new store on the same file) would double the records: refused, naming both options.
    refused = r"rollouts.jsonl already holds.*mode=\"append\".*mode=\"overwrite\""
    with pytest.raises(StoreError, match=refused):
        JsonlStore(path).write(tool_trajectory(group="c"))
    assert [t.meta.group_id for t in read_trajectories(path)] == ["a", "b"]
    with JsonlStore(path, mode="append") as s:
        s.write(tool_trajectory(group="c"))
    assert [t.meta.group_id for t in read_trajectories(path)] == ["a", "b", "c"]
    with JsonlStore(path, mode="overwrite") as s:
        s.write(tool_trajectory(group="d"))
        s.close()
        s.write(tool_trajectory(group="e"))  # overwrite empties the file once, not at every reopen
    assert [t.meta.group_id for t in read_trajectories(path)] == ["d", "e"]
    # An empty file holds nothing to protect; reading never needs a mode.
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with JsonlStore(empty) as s:
        s.write(tool_trajectory())
    assert len(list(JsonlStore(empty).read())) == 1
    with pytest.raises(StoreError, match="mode must be one of"):
        JsonlStore(path, mode="add")  # type: ignore[arg-type]


def test_an_append_nobody_awaited_still_writes(tmp_path):
    # Issue 47: `store.append(t)` without `await` used to create a coroutine and write nothing.
    from agentrl import JsonlStore, read_trajectories
    from agentrl.types import Message, Trajectory

    t = Trajectory((), (), (), (), (Message("user", "hi"),), ())
    with JsonlStore(tmp_path / "t.jsonl") as store:
        store.append(t)  # forgotten await

        async def awaited() -> None:
            await store.append(t)

        asyncio.run(awaited())
    assert len(list(read_trajectories(tmp_path / "t.jsonl"))) == 2
