"""The Codex CLI through the gateway: ``@openai/codex`` (npm, installed by ``.ci/setup --dev`` into
``.ci/node``) runs ``codex exec`` offline with a custom provider whose ``base_url`` is a gateway session and
``wire_api = "responses"``. With a scripted policy its tool loop (an ``exec_command`` call that Codex runs in
its own sandbox, then the answer) is recorded as one audited segment; with the tiny model (nonsense text)
through ``agentrl gateway`` the session is recorded and ``agentrl replay --check`` audits it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from agentrl.audit import audit_trajectory
from agentrl.testing import ScriptedPolicy
from agentrl.trainers.gateway import Gateway, GatewayConfig
from agentrl.types import StopReason

from .helpers import assert_harness_run_recorded
from .test_cli import AGENTRL, wait_for_url

ROOT = Path(__file__).resolve().parents[2]


def codex_binary() -> str | None:
    """The Codex CLI: $AGENTRL_CODEX, else .ci/node's (from .ci/setup --dev), else one on PATH."""
    for path in (
        os.environ.get("AGENTRL_CODEX"),
        str(ROOT / ".ci/node/node_modules/.bin/codex"),
        shutil.which("codex"),
    ):
        if path and Path(path).is_file():
            try:
                out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if out.returncode == 0 and out.stdout.startswith("codex-cli"):
                return path
    return None


CODEX = codex_binary()
needs_codex = pytest.mark.skipif(
    CODEX is None, reason="the Codex CLI is not installed (bash .ci/setup --dev puts it in .ci/node)"
)

INSTRUCTIONS = "You are a terse coding assistant."


def codex_config(base_url: str, instructions: Path) -> str:
    """``config.toml`` that points Codex at a gateway session, offline (docs/gateway.md says why each)."""
    return f"""model = "agentrl-policy"
model_provider = "agentrl"
model_reasoning_summary = "none"  # no reasoning summary (the policy writes no reasoning items)
web_search = "disabled"           # a server-side tool: the gateway refuses non-function tools
check_for_update_on_startup = false
model_instructions_file = "{instructions}"  # its own system prompt is ~4k tokens; the tiny model has 4k

[agents]
enabled = false                   # no sub-agent tools (a "namespace" tool type)

[analytics]
enabled = false

[features]
goals = false                     # three more tools the policy does not need

[model_providers.agentrl]
name = "agentrl gateway"
base_url = "{base_url}"
wire_api = "responses"
env_key = "AGENTRL_GATEWAY_KEY"
request_max_retries = 0
stream_max_retries = 0
"""


def run_codex(base_url: str, tmp: Path, prompt: str) -> subprocess.CompletedProcess[str]:
    assert CODEX is not None
    home = tmp / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "instructions.md").write_text(INSTRUCTIONS + "\n")
    (home / "config.toml").write_text(codex_config(base_url, home / "instructions.md"))
    for d in ("home", "tmpdir"):
        (tmp / d).mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(
        CODEX_HOME=str(home),  # config.toml, sessions, logs
        HOME=str(tmp / "home"),
        AGENTRL_GATEWAY_KEY="gateway-key",  # sent as the Bearer token; no login needed
        # Codex refuses to put its sandbox helper next to a CODEX_HOME inside the temporary folder (and
        # then its sandbox cannot start); a TMPDIR of its own keeps CODEX_HOME outside it.
        TMPDIR=str(tmp / "tmpdir"),
    )
    return subprocess.run(
        [CODEX, "exec", "--skip-git-repo-check", "--sandbox", "read-only", prompt],
        cwd=tmp,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )


@needs_codex  # a few seconds: a real harness in the fast tier
async def test_codex_tool_loop_is_one_audited_segment(renderer, tmp_path):
    (tmp_path / "note.txt").write_text("The secret word is banana.\n")
    call = json.dumps({"name": "exec_command", "arguments": {"cmd": "cat note.txt"}})
    end = [renderer.stop_token_ids[0]]
    turns = [f"Let me read it.\n<tool_call>\n{call}\n</tool_call>", "The secret word is banana."]
    policy = ScriptedPolicy(
        [[*renderer.encode(t), *end] for t in turns], stop_ids=renderer.stop_token_ids, logprob=-0.25
    )
    async with Gateway(policy, renderer, GatewayConfig(max_total_tokens=8192)) as gw:
        out = await asyncio.to_thread(
            run_codex, gw.base_url("cx"), tmp_path, "What is the secret word in note.txt?"
        )
        (traj,) = await gw.finish("cx", 1.0)
    assert out.returncode == 0 and "banana" in out.stdout, out.stderr[-3000:]
    assert "unrecognized configuration" not in out.stderr and "ERROR" not in out.stderr, out.stderr[-3000:]
    assert (traj.num_turns, traj.stop_reason, traj.errors, traj.meta.extra["segments"]) == (
        2,
        StopReason.TERMINATED,
        (),
        1,
    )
    (record,) = traj.tool_calls
    # Codex ran the command in its own sandbox, and its output is in the record
    assert (
        record.name == "exec_command" and "exited with code 0" in record.output and "banana" in record.output
    )
    assert traj.messages[0].content.startswith(INSTRUCTIONS)
    audit_trajectory(traj, renderer)


@needs_codex
@pytest.mark.slow
def test_codex_against_agentrl_gateway_with_the_tiny_model(tmp_path):
    out = tmp_path / "gw"
    proc = subprocess.Popen(
        [*AGENTRL, "gateway", "--model", "tiny", "--out", str(out), "--port", "0", "--max-new-tokens", "16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = wait_for_url(proc)
        result = run_codex(f"{url}/s/codex/v1", tmp_path, "List the files here.")
        # The random model never ends its turn within 16 tokens: the turn comes back incomplete, which
        # Codex reports as an error (exit status 1) after the session went through the gateway.
        cut = "Incomplete response returned, reason: max_output_tokens" in result.stderr
        assert result.returncode == 0 or cut, result.stderr[-3000:]
        r = httpx.post(f"{url}/s/codex/finish", json={"reward": 0.0, "info": {"task_id": "codex"}})
        assert r.status_code == 200, r.text
        segments = r.json()["trajectories"]
        assert segments and all(t["trainable"] for t in segments)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_harness_run_recorded(out, proc.returncode, stderr, "codex", "codex")
