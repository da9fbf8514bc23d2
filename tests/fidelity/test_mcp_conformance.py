"""agentrl.tools.mcp against the MCP project's own references: the conformance suite's client scenarios
(npm ``@modelcontextprotocol/conformance``), and the reference servers (``server-everything``,
``mcp-server-time``, ``mcp-server-git``) as tools in a ToolEnv that plays an episode and trains a step.
``.ci/setup --dev`` installs the npm packages into ``.npm-tools``; docs/fidelity.md has the results."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")
pytest.importorskip("mcp_server_time", reason="the dev extra installs mcp-server-time")
pytest.importorskip("mcp_server_git", reason="the dev extra installs mcp-server-git")

from agentrl.types import Action, ToolStatus

from .mcp_reference_env import EVERYTHING, NODE, NPM, ReferenceServersEnv

ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE = NPM / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
CLIENT = Path(__file__).with_name("mcp_conformance_client.py")

pytestmark = [
    pytest.mark.slow,  # each conformance scenario starts the suite and a Python client: ~10-40 s
    pytest.mark.skipif(not CONFORMANCE.exists(), reason="run .ci/setup --dev (installs .npm-tools)"),
]


def conformance(scenario: str, tmp_path: Path) -> tuple[int, str]:
    """Run one client scenario of the suite against the agentrl client command."""
    command = f"{sys.executable} {CLIENT}"
    argv = [str(NODE), str(CONFORMANCE), "client", "--command", command, "--scenario", scenario]
    argv += ["--timeout", "120000", "-o", str(tmp_path)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    return out.returncode, out.stdout + out.stderr


# The suite's retry-timing check takes the first GET after it closes the tools/call stream for the
# reconnection. The MCP SDK opens its standalone GET stream from a background task after `initialized`;
# on a busy machine that GET can arrive after the tools/call POST, and the check then reads it as a
# reconnection that came before the close ("-52ms instead of 500ms", seen under a full .ci/run). A GET
# that precedes the close cannot be a reconnection to it, so only that failure runs the scenario again.
_EARLY_STANDALONE_GET = re.compile(r"reconnected too early \(-\d+ms instead of")


def _only_an_early_standalone_get(log: str) -> bool:
    failed = re.findall(r"^\s*- (\w+):", log.split("Failed Checks:", 1)[-1].split("Warning Checks:")[0], re.M)
    return failed == ["ClientRespectsRetryField"] and _EARLY_STANDALONE_GET.search(log) is not None


@pytest.mark.parametrize("scenario", ["initialize", "tools_call", "sse-retry"])
def test_client_scenarios_pass(scenario, tmp_path):
    rc, log = conformance(scenario, tmp_path)
    for attempt in (2, 3):
        if rc == 0 or not _only_an_early_standalone_get(log):
            break
        (tmp_path / str(attempt)).mkdir()
        rc, log = conformance(scenario, tmp_path / str(attempt))
    assert rc == 0 and "OVERALL: PASSED" in log, log[-3000:]


def test_only_a_get_before_the_close_runs_the_retry_scenario_again():
    early = (
        "Failed Checks:\n  - ClientRespectsRetryField: Client MUST respect the retry field\n"
        "    Error: Client reconnected too early (-52ms instead of 500ms).\nWarning Checks:\n"
    )
    late = early.replace("(-52ms", "(120ms")
    both = early.replace("Warning Checks:", "  - ClientGracefulReconnect: no GET\nWarning Checks:")
    assert _only_an_early_standalone_get(early)
    assert not _only_an_early_standalone_get(late)  # a reconnection that came too early fails at once
    assert not _only_an_early_standalone_get(both)


def hermes(name: str, **arguments) -> Action:
    return Action(f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>")


def test_reference_servers_play_an_episode_as_tools():
    async def episode():
        env = ReferenceServersEnv()
        try:
            await env.reset(seed=3)
            a, b = env.numbers
            names = {t.name for t in env.executor.tool_list()}
            assert {"get_current_time", "convert_time", "git_status", "git_log", "echo", "get-sum"} <= names
            res = await env.step(hermes("get-sum", a=a, b=b))
            assert [r.status for r in res.tool_calls] == [ToolStatus.OK]
            assert f"is {a + b}" in res.observation[0].content
            time_call = hermes("get_current_time", timezone="Europe/Zurich").text
            log_call = hermes("git_log", repo_path=str(env.repo), max_count=1).text
            res = await env.step(Action(time_call + "\n" + log_call))
            assert [r.status for r in res.tool_calls] == [ToolStatus.OK, ToolStatus.OK], res.tool_calls
            assert (
                "Europe/Zurich" in res.observation[0].content and "first note" in res.observation[1].content
            )
            res = await env.step(hermes("get_current_time", timezone="Mars/Olympus"))
            assert res.tool_calls[0].status is ToolStatus.ERROR  # the server's own error, shown to the model
            final = await env.step(Action(f"Answer: {a + b}"))
            assert final.terminated and final.reward == 1.0
        finally:
            await env.close()

    asyncio.run(episode())


def test_reference_servers_env_trains_a_step(tmp_path):
    env = f"{Path(__file__).with_name('mcp_reference_env.py')}:ReferenceServersEnv"
    argv = [
        sys.executable,
        "-m",
        "agentrl.trainers",
        "train",
        "--env",
        env,
        "--model",
        "tiny",
        "--steps",
        "1",
    ]
    argv += ["--group-size", "2", "--groups-per-step", "1", "--rollout.max-new-tokens", "16"]
    argv += ["--eval.tasks", "0", "--no-progress", "--out", str(tmp_path / "run")]
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "step 0:" in out.stdout and "infra" not in out.stdout.split("step 0:")[1].split("\n")[0]
    assert NODE.exists() and EVERYTHING.exists()
