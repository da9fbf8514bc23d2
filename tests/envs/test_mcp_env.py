"""The MCP example env (examples/mcp_units_env.py): a ToolEnv whose tools come from a sandboxed stdio MCP
server. Per-episode server sessions, the shared-session option, agentrl check_env with the sample episode,
a scripted episode through the real tokenizer, and from the CLI: train a step, then replay with
re-execution of the recorded MCP calls."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

import agentrl
from agentrl.envs import Task, ToolEnv
from agentrl.sandbox.local import find_bwrap
from agentrl.tools.mcp import MCPServer
from agentrl.types import Action, ToolStatus

ROOT = Path(__file__).resolve().parents[2]
ENV = f"{ROOT / 'examples' / 'mcp_units_env.py'}:UnitsEnv"
SERVER = [sys.executable, str(ROOT / "examples" / "mcp_units_server.py")]
AGENTRL = [sys.executable, "-m", "agentrl.trainers"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed"),
]


class Notes(ToolEnv):
    def __init__(self, server, **kwargs):
        super().__init__([server], parser="hermes", **kwargs)

    def make_task(self, options):
        return Task("Keep notes.")


def call(name, **arguments):
    return Action(f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>")


async def test_each_episode_gets_a_fresh_server_and_shared_mode_keeps_one():
    env = Notes(MCPServer(command=SERVER, prefix="n_", include=["remember", "recall"]))
    assert [t.name for t in env.executor.tool_list()] == ["n_remember", "n_recall"]
    assert '"name": "n_recall"' in (await env.reset(seed=0))[0][0].content  # the schemas are in the prompt
    try:
        assert (await env.step(call("n_remember", key="k", value="v"))).tool_calls[0].status == ToolStatus.OK
        assert (await env.step(call("n_recall", key="k"))).tool_calls[0].output == "v"
        await env.reset(seed=1)
        (record,) = (await env.step(call("n_recall", key="k"))).tool_calls
        assert record.status == ToolStatus.ERROR and "no note 'k'" in record.output  # a new process
    finally:
        await env.close()

    shared = MCPServer(command=SERVER, include=["remember", "recall"], session="shared")
    envs = [Notes(shared), Notes(shared)]
    try:
        await envs[0].reset(seed=0)
        await envs[0].step(call("remember", key="k", value="kept"))
        await envs[1].reset(seed=1)
        assert (await envs[1].step(call("recall", key="k"))).tool_calls[0].output == "kept"
    finally:
        for e in envs:
            await e.close()
        await shared.aclose()


def test_check_env_plays_the_mcp_sample_episode():
    from agentrl._sync import run_sync

    env = agentrl.make(ENV)
    try:
        agentrl.check_env(env)
    finally:
        run_sync(env.close())


async def test_a_server_crash_ends_the_episode_as_an_infrastructure_failure():
    faults = [sys.executable, str(ROOT / "tests" / "tools" / "mcp_fault_server.py")]
    env = Notes(MCPServer(command=faults, include=["die", "echo"]))
    await env.reset(seed=0)
    try:
        result = await env.step(call("die", code=1))
        (record,) = result.tool_calls
        assert (
            record.status == ToolStatus.SANDBOX_ERROR and result.truncated and result.infra_error is not None
        )
    finally:
        await env.close()


def test_trains_a_step_and_replays_the_mcp_calls_from_the_cli(tmp_path, tok, capsys):
    """The training step runs ``python -m agentrl.trainers`` in a fresh interpreter (the env found by its
    path with nothing imported beforehand); the replay calls the same CLI's ``main`` in this process (its
    re-execution still starts a fresh server process for the recorded call)."""
    from agentrl.chat import ChatRenderer
    from agentrl.episode import RolloutConfig, run_episode
    from agentrl.store import JsonlStore
    from agentrl.testing import ScriptedPolicy
    from agentrl.trainers.cli import main as cli_main

    argv = ["train", "--env", ENV, "--model", "tiny", "--steps", "1", "--group-size", "2"]
    argv += ["--groups-per-step", "2", "--eval.tasks", "0", "--no-progress", "--out", str(tmp_path / "run")]
    out = subprocess.run([*AGENTRL, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "step 0:" in out.stdout and "infra" not in out.stdout.split("step 0:")[1].split("\n")[0]

    # The tiny random model never writes a tool call, so record a scripted episode that does, and replay
    # it from the CLI: --reexec runs its MCP call again in a fresh env (a fresh server process).
    renderer = ChatRenderer(tok)

    async def scripted():
        env = agentrl.make(ENV)
        try:
            await env.reset(seed=5)
            turns = [[*tok.encode(t), renderer.stop_token_ids[0]] for t in env.sample_actions()]
            policy = ScriptedPolicy(turns, stop_ids=renderer.stop_token_ids)
            traj = await run_episode(
                env, policy, renderer, RolloutConfig(max_turns=3, max_new_tokens=128), seed=5
            )
        finally:
            await env.close()
        with JsonlStore(tmp_path / "scripted.jsonl") as store:
            await store.append(traj)
        return traj

    traj = asyncio.run(scripted())
    assert traj.reward == 1.0 and [c.status for c in traj.tool_calls] == [ToolStatus.OK]
    assert " = " in traj.tool_calls[0].output
    capsys.readouterr()
    code = cli_main(["replay", str(tmp_path / "scripted.jsonl"), "--reexec", "--rescore"])
    captured = capsys.readouterr()
    stdout = captured.out
    assert code == 0, stdout[-3000:] + captured.err[-3000:]
    assert "1 tool call(s), all identical" in stdout and "1 of 1 rewards reproduced" in stdout, stdout


async def test_a_slow_server_start_is_not_the_models_timeout():
    """The episode's server starts before the turn's calls run, outside the env's per-call time limit."""
    faults = [sys.executable, str(ROOT / "tests" / "tools" / "mcp_fault_server.py"), "--slow-start", "4"]
    env = Notes(MCPServer(command=faults, include=["echo"]), tool_timeout=3)
    await env.reset(seed=0)
    try:
        (record,) = (await env.step(call("echo", text="late"))).tool_calls
        assert (record.status, record.output) == (ToolStatus.OK, "late")
    finally:
        await env.close()
