"""Agent-driven rollouts: task sources, groups with native meta, and what an agent's failure records."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from agentrl.errors import ConfigError
from agentrl.trainers.gateway import Gateway, GatewayConfig
from agentrl.trainers.gateway.agent_rollout import (
    AgentRunner,
    AgentTask,
    EnvTasks,
    JsonlTasks,
    load_agent,
    task_source,
)
from agentrl.types import StopReason, TrajectoryMeta

from .helpers import ECHO_SCHEMA, ask, client_for, scripted

TASKS = [
    {"id": "t0", "prompt": "Say hi.", "answer": "hi"},
    {
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Echo x."}],
        "tools": [ECHO_SCHEMA],
        "answer": "x",
    },
]


@pytest.fixture
def task_file(tmp_path):
    p = tmp_path / "tasks.jsonl"
    p.write_text("\n".join(json.dumps(t) for t in TASKS) + "\n")
    return p


async def test_jsonl_tasks_in_order_by_seed(task_file):
    src = task_source(str(task_file))
    assert isinstance(src, JsonlTasks) and src.parser == "hermes"
    t0, t1, t2 = [await src.task(s) for s in (0, 1, 2)]
    assert t0.messages == ({"role": "user", "content": "Say hi."},) and t0.prompt == "Say hi."
    assert t0.info == {"id": "t0", "answer": "hi"} and t0.id == f"{task_file}:0"
    assert t1.tools == (ECHO_SCHEMA,) and t1.prompt == "Echo x." and t1.info == {"answer": "x"}
    assert t2.messages == t0.messages and t2.seed == 2


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("not json", "not valid JSON"),
        ("[1]", "JSON object"),
        ('{"answer": 1}', "'messages'"),
        ('{"prompt": "x", "tools": [{"type": "function", "function": {"name": "a b"}}]}', "must match"),
    ],
)
def test_bad_task_files_name_the_line(tmp_path, line, words):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(ConfigError, match=f"bad.jsonl:2: .*{words}"):
        JsonlTasks(p)


async def test_env_tasks_carry_the_tool_schemas_and_the_envs_parser():
    src = EnvTasks("calculator-v0")
    task = await src.task(3)
    assert src.parser == "hermes" and task.tools[0]["function"]["name"] == "calculator"
    assert "<tool_call>" not in task.messages[0]["content"]  # the gateway adds the instructions
    assert isinstance(task.info["answer"], int) and task.id == "calculator-v0:3"
    assert (await EnvTasks("math-tir-arith-v0").task(0)).id == "math-tir-arith-v0:0"
    assert EnvTasks("math-tir-arith-v0").parser == "python"


def test_load_agent_errors(tmp_path):
    f = tmp_path / "agent.py"
    f.write_text(
        "async def good(task, base_url):\n    return 1.0\n\ndef sync(task, base_url):\n    return 1.0\n"
    )
    assert load_agent(f"{f}:good").__name__ == "good"
    with pytest.raises(ConfigError, match="async function"):
        load_agent(f"{f}:sync")
    with pytest.raises(ConfigError, match="has no 'missing'"):
        load_agent(f"{f}:missing")
    with pytest.raises(ConfigError, match=r"FILE\.py:FUNC"):
        load_agent(str(f))
    with pytest.raises(ConfigError, match="is not a file"):
        load_agent(f"{tmp_path}/nope.py:good")


CALL = '<tool_call>\n{"name": "echo", "arguments": {"text": "x"}}\n</tool_call>'


async def polite(task, base_url):
    """Answers once and returns 1.0 when the reply mentions the answer."""
    reply, _ = await ask(client_for(base_url), list(task.messages), tools=list(task.tools) or None)
    return float(task.info["answer"] in (reply.get("content") or ""))


async def crashing(task, base_url):
    await ask(client_for(base_url), list(task.messages))
    raise KeyError("the agent's own bug")


async def looping(task, base_url):
    """Calls the echo tool forever: the gateway's turn limit ends it with a 400 it does not catch."""
    c, messages = client_for(base_url), list(task.messages)
    while True:
        msg, _ = await ask(c, messages)
        messages += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "x"}]


async def finishes_itself(task, base_url):
    """Reports its reward over HTTP (as it would to a standalone gateway), then returns another."""
    await ask(client_for(base_url), list(task.messages))
    async with httpx.AsyncClient() as http:
        r = await http.post(base_url.removesuffix("/v1") + "/finish", json={"reward": 0.75})
        assert r.status_code == 200, r.text
    return 0.0


async def returns_text(task, base_url):
    await ask(client_for(base_url), list(task.messages))
    return "1.0"


async def test_groups_get_native_meta_and_failures_are_recorded_right(renderer, task_file):
    policy = scripted(renderer, ("Sure: hi and x",))
    cfg = GatewayConfig(max_turns=2, temperature=1.0)
    async with Gateway(policy, renderer, cfg, auto_sessions=False) as gw:
        meta = TrajectoryMeta(env_id=str(task_file), step=7, policy_version=0)
        runner = AgentRunner(polite, JsonlTasks(task_file), gw, concurrency=3)
        events = [e async for e in runner.run_groups(seeds=[0, 1], group_size=3, meta=meta)]
        trajs = [e.trajectory for e in events]
        assert len(trajs) == 6 and len({t.meta.group_id for t in trajs}) == 2
        groups = [e.group for e in events if e.group is not None]  # the event that completes a group
        assert sorted(len(g) for g in groups) == [3, 3]
        assert {t.meta.episode_id for g in groups for t in g} == {t.meta.episode_id for t in trajs}
        assert sorted({t.meta.task_id for t in trajs}) == [f"{task_file}:0", f"{task_file}:1"]
        assert all(t.meta.step == 7 and not t.infra_failure and t.meta.seed in (0, 1) for t in trajs)
        assert not gw.core.sessions  # every session closed

        (crash,) = await AgentRunner(crashing, JsonlTasks(task_file), gw).run_group(0, 1, meta)
        assert (
            crash.infra_failure
            and crash.stop_reason is StopReason.ENV_ERROR
            and "own bug" in crash.errors[-1].message
        )

        (own,) = await AgentRunner(finishes_itself, JsonlTasks(task_file), gw).run_group(0, 1, meta)
        assert own.reward == 0.75 and not own.infra_failure and not gw.core._results

        (text,) = await AgentRunner(returns_text, JsonlTasks(task_file), gw).run_group(0, 1, meta)
        assert text.infra_failure and "not a finite number" in text.errors[-1].message

    async with Gateway(scripted(renderer, (CALL,)), renderer, cfg, auto_sessions=False) as gw:
        (loop,) = await AgentRunner(looping, JsonlTasks(task_file), gw).run_group(1, 1, meta)
    # A limit hit is the model's business: truncated and trained on with reward 0, not an infra failure.
    assert not loop.infra_failure and loop.truncated and loop.stop_reason is StopReason.MAX_TURNS
    assert loop.reward == 0.0 and loop.num_turns == 2 and loop.errors[-1].kind == "BadRequestError"


class FlakyTasks:
    """Task 1 cannot be made (its env failed); the others can."""

    name, parser = "flaky", "hermes"

    async def task(self, seed):
        if seed == 1:
            raise RuntimeError("task 1 is broken")
        await asyncio.sleep(0.05 * seed)
        return AgentTask(f"flaky:{seed}", ({"role": "user", "content": "Say hi."},), info={"answer": "hi"})


async def slow_agent(task, base_url):
    await asyncio.sleep(30)
    return 1.0


async def test_a_failing_task_source_stops_every_group(renderer):
    async with Gateway(scripted(renderer), renderer, auto_sessions=False) as gw:
        runner = AgentRunner(slow_agent, FlakyTasks(), gw)
        with pytest.raises(RuntimeError, match="task 1 is broken"):
            async for _ in runner.run_groups(seeds=[0, 1, 2], group_size=2):
                pass
        await asyncio.sleep(0)
        left = [t for t in asyncio.all_tasks() if "schedule_groups" in t.get_coro().__qualname__]
        assert not left, "groups of the failed run are still running"
