"""A real harness CLI through the gateway: Claude Code (``@anthropic-ai/claude-code`` from npm, installed by
``.ci/setup --dev`` into ``.ci/node``) runs ``claude -p`` with ``ANTHROPIC_BASE_URL`` at a gateway session,
offline. With a scripted policy its tool loop (a ``Read`` call, Claude Code runs it, the answer) is recorded
as one audited segment; with the tiny model (nonsense text) through ``agentrl gateway`` the session is
recorded and ``agentrl replay --check`` audits it."""

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


def claude_binary() -> str | None:
    """The Claude Code CLI: $AGENTRL_CLAUDE, else .ci/node's (from .ci/setup --dev), else one on PATH."""
    found = [
        os.environ.get("AGENTRL_CLAUDE"),
        str(ROOT / ".ci/node/node_modules/.bin/claude"),
        str(ROOT / ".ci/node/node_modules/@anthropic-ai/claude-code-linux-x64/claude"),
        shutil.which("claude"),
    ]
    for path in found:
        if path and Path(path).is_file():
            try:
                out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if out.returncode == 0 and "Claude Code" in out.stdout:
                return path
    return None


CLAUDE = claude_binary()
needs_claude = pytest.mark.skipif(
    CLAUDE is None, reason="Claude Code is not installed (bash .ci/setup --dev puts it in .ci/node)"
)


def claude_env(base_url: str, home: Path) -> dict[str, str]:
    """What ``claude -p`` needs to run offline against the gateway (docs/gateway.md says why each)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    return {
        **env,
        "HOME": str(home),  # its settings, sessions and caches: a throwaway home
        "ANTHROPIC_BASE_URL": base_url,  # http://HOST:PORT/s/<session_id>; it adds /v1/messages
        "ANTHROPIC_API_KEY": "gateway-key",  # sent as x-api-key; no login needed
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no telemetry, error reports, update checks
        "DISABLE_AUTOUPDATER": "1",
        "MAX_THINKING_TOKENS": "0",  # no extended thinking (the gateway refuses it)
    }


def run_claude(base_url: str, tmp: Path, prompt: str, *, max_turns: int) -> dict:
    assert CLAUDE is not None
    (tmp / "home").mkdir(exist_ok=True)
    out = subprocess.run(
        [
            CLAUDE,
            "-p",
            prompt,
            "--max-turns",
            str(max_turns),
            "--model",
            "agentrl-policy",
            "--output-format",
            "json",
            "--tools",
            "Read",  # one small tool keeps the prompt short for the tiny model (all tools: ~10k tokens)
            "--system-prompt",
            "You are a terse assistant.",
        ],
        cwd=tmp,
        env=claude_env(base_url, tmp / "home"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.stdout.strip(), out.stderr[-2000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@needs_claude  # about 2 s: a real harness in the fast tier
async def test_claude_code_tool_loop_is_one_audited_segment(renderer, tmp_path):
    note = tmp_path / "note.txt"
    note.write_text("The secret word is banana.\n")
    call = json.dumps({"name": "Read", "arguments": {"file_path": str(note)}})
    end = [renderer.stop_token_ids[0]]
    turns = [f"Let me read it.\n<tool_call>\n{call}\n</tool_call>", "The secret word is banana."]
    policy = ScriptedPolicy(
        [[*renderer.encode(t), *end] for t in turns], stop_ids=renderer.stop_token_ids, logprob=-0.25
    )
    async with Gateway(policy, renderer, GatewayConfig(max_total_tokens=8192)) as gw:
        result = await asyncio.to_thread(
            run_claude,
            gw.anthropic_base_url("cc"),
            tmp_path,
            "What is the secret word in note.txt?",
            max_turns=3,
        )
        (traj,) = await gw.finish("cc", 1.0)
    assert result["is_error"] is False and "banana" in result["result"], result
    assert (traj.num_turns, traj.stop_reason, traj.errors, traj.meta.extra["segments"]) == (
        2,
        StopReason.TERMINATED,
        (),
        1,
    )
    (record,) = traj.tool_calls
    assert record.name == "Read" and "banana" in record.output  # Claude Code ran the tool; its result is in
    audit_trajectory(traj, renderer)


@needs_claude
@pytest.mark.slow
def test_claude_code_against_agentrl_gateway_with_the_tiny_model(tmp_path):
    out = tmp_path / "gw"
    proc = subprocess.Popen(
        [*AGENTRL, "gateway", "--model", "tiny", "--out", str(out), "--port", "0", "--max-new-tokens", "16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = wait_for_url(proc)
        result = run_claude(f"{url}/s/claude", tmp_path, "List the files here.", max_turns=2)
        assert result["type"] == "result" and result["usage"]["input_tokens"] > 500, result
        r = httpx.post(f"{url}/s/claude/finish", json={"reward": 0.0, "info": {"task_id": "claude-code"}})
        assert r.status_code == 200, r.text
        segments = r.json()["trajectories"]
        assert segments and all(t["trainable"] for t in segments)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_harness_run_recorded(out, proc.returncode, stderr, "claude", "claude-code")
