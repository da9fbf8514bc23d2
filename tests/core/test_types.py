"""Records: validation, OpenAI wire format, structural invariants of a trajectory."""

import dataclasses
import json

import pytest

from agentrl.errors import AuditError, ConfigError, FormatError
from agentrl.execution import ExecResult, ExecStatus, Limits
from agentrl.types import Message, StopReason, ToolCall, ToolRecord, ToolStatus, Trajectory

from .test_store import tool_trajectory


def test_message_round_trip_openai_format():
    d = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "python", "arguments": '{"code": "1"}'},
            }
        ],
    }
    m = Message.from_dict(d)
    assert m.content == "" and m.tool_calls == (ToolCall("c1", "python", '{"code": "1"}'),)
    assert Message.from_dict(m.to_dict()) == m


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"role": "robot", "content": "x"}, "role must be one of"),
        ({"role": "user", "content": 3}, "content must be a str"),
        (
            {"role": "user", "content": "", "tool_calls": (ToolCall("a", "b", "{}"),)},
            "only assistant",
        ),
    ],
)
def test_message_rejects_bad_input(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Message(**kwargs)


def test_trajectory_properties():
    t = tool_trajectory()
    assert t.reward == 1.0 and t.num_model_tokens == 5 and t.num_turns == 2
    assert not t.infra_failure
    assert dataclasses.replace(t, stop_reason=StopReason.SANDBOX_ERROR).infra_failure


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda t: dataclasses.replace(t, loss_mask=t.loss_mask[:-1]), "length mismatch"),
        (lambda t: dataclasses.replace(t, loss_mask=(0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1)), "token 6"),
        (lambda t: dataclasses.replace(t, logprobs=(None,) * 11), "sampled but its log-prob"),
        (lambda t: dataclasses.replace(t, logprobs=(-1.0, *t.logprobs[1:])), "not sampled"),
        (lambda t: dataclasses.replace(t, segments=t.segments[:-1]), "cover 9 of 11"),
    ],
)
def test_validate_points_at_the_broken_token(edit, match):
    with pytest.raises(AuditError, match=match):
        edit(tool_trajectory()).validate()


def test_limits_clamp_never_raises_a_limit():
    cap = Limits(wall_s=5, memory_bytes=1 << 28)
    asked = Limits(wall_s=60, memory_bytes=1 << 20, network=True)
    got = cap.clamp(asked)
    assert got.wall_s == 5 and got.memory_bytes == 1 << 20 and got.network is False
    assert cap.clamp(wall_s=1).wall_s == 1 and cap.clamp(wall_s=100).wall_s == 5
    with pytest.raises(ConfigError, match="positive"):
        Limits(wall_s=0)
    with pytest.raises(ConfigError, match="timeout"):
        cap.clamp(wall_s=-1)
    assert ExecStatus.SANDBOX_ERROR.is_infra and not ExecStatus.TIMEOUT.is_infra


def test_trajectory_json_is_one_line():
    t = tool_trajectory()
    assert "\n" not in t.to_json()
    assert Trajectory.from_dict(t.to_dict()) == t


@pytest.mark.parametrize("status", list(ToolStatus))
def test_tool_statuses_round_trip_as_their_readable_strings(status):
    rec = ToolRecord("c1", "python", "{}", "out", status, 0.5, 0)
    d = rec.to_dict()
    assert d["status"] == status.value and isinstance(d["status"], str)
    assert ToolRecord.from_dict(json.loads(json.dumps(d))) == rec


def test_status_strings_of_old_files_still_load_and_sandbox_runs_share_them():
    old = ["ok", "error", "timeout", "oom", "output_limit", "killed", "parse_error", "unknown_tool"]
    old += ["bad_arguments", "sandbox_error"]
    assert [s.value for s in ToolStatus] == old  # what trajectories.jsonl has always stored
    assert ExecStatus is ToolStatus  # one vocabulary; the old name still imports
    runs = [s for s in ToolStatus if not s.is_call_error]
    assert ExecResult(ToolStatus.TIMEOUT).status is ToolStatus.TIMEOUT and len(runs) == 7
    with pytest.raises(FormatError, match="unknown tool status 'great'"):
        ToolRecord.from_dict(
            {**ToolRecord("c", "n", "{}", "", ToolStatus.OK, 0, 0).to_dict(), "status": "great"}
        )


@pytest.mark.parametrize(
    "wire, match",
    [
        ({"content": "no role"}, "needs at least a role"),
        ({"role": "robot", "content": "x"}, "role must be one of"),
        ({"role": "user", "content": 3}, "content must be a str"),
        ({"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}, "function.name/arguments"),
        ({"role": "assistant", "content": "", "tool_calls": "call"}, "must be a list"),
        ("not a dict", "needs at least a role"),
    ],
)
def test_bad_wire_messages_raise_the_format_error(wire, match):
    with pytest.raises(FormatError, match=match) as info:
        Message.from_dict(wire)
    assert isinstance(info.value, ValueError) and not isinstance(info.value, ConfigError)
