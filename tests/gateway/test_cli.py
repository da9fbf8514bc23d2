"""The command line end to end: ``agentrl gateway`` serves and records until SIGTERM; ``agentrl train
--agent`` trains the README's openai-client agent for a step; both runs pass ``agentrl replay --check``."""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from agentrl import read_trajectories
from agentrl.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = [sys.executable, "-m", "agentrl.trainers"]


def replay_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``agentrl replay ARGS`` through the CLI's ``main`` in this process: (exit code, stdout). The run it
    reads was written by another process; a fresh interpreter's imports would add nothing to its checks."""
    from agentrl.trainers.cli import main

    capsys.readouterr()
    code = main(["replay", *args])
    return code, capsys.readouterr().out


def wait_for_url(proc: subprocess.Popen, timeout: float = 120) -> str:
    assert proc.stdout is not None
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            m = re.search(r"at (http://127\.0\.0\.1:\d+);", line)
            if m:
                return m.group(1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"the gateway did not start: {proc.stderr.read() if proc.stderr else ''}")


@pytest.mark.slow
def test_gateway_command_records_sessions_and_stops_cleanly(tmp_path, capsys):
    out = tmp_path / "gw"
    proc = subprocess.Popen(
        [*AGENTRL, "gateway", "--model", "tiny", "--out", str(out), "--port", "0", "--max-new-tokens", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = wait_for_url(proc)
        with openai.OpenAI(base_url=f"{url}/s/first/v1", api_key="sk-anything", max_retries=0) as client:
            assert client.models.list().data[0].id == "agentrl-policy"
            reply = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi!"}])
        assert reply.usage is not None and reply.usage.completion_tokens <= 8
        assert reply.choices[0].finish_reason in ("stop", "length")
        r = httpx.post(f"{url}/s/first/finish", json={"reward": 0.25, "info": {"task_id": "greet"}})
        assert r.status_code == 200 and r.json()["trajectories"][0]["trainable"]
        with openai.OpenAI(base_url=f"{url}/s/open/v1", api_key="k", max_retries=0) as c:
            c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Still there?"}])
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    assert "1 open sessions recorded as cancelled" in stdout
    issues: list = []
    done, cancelled = read_trajectories(out / "trajectories.jsonl", issues=issues)
    assert not issues and (done.reward, done.meta.task_id, done.infra_failure) == (0.25, "greet", False)
    assert cancelled.infra_failure and cancelled.stop_reason.value == "cancelled"
    code, check = replay_in_process(capsys, str(out), "--check")
    assert code == 0 and "2 of 2 trajectories consistent (2 with the full token audit)" in check, check


def test_the_readme_agent_is_the_example_that_trains():
    readme = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "async def solve" in b]
    example = (ROOT / "examples" / "gateway_agent.py").read_text()
    assert block.strip() in example and "agent written only against the ``openai`` client" in example


@pytest.mark.slow
def test_train_agent_for_one_step_and_replay(tmp_path, capsys):
    agent = ROOT / "examples" / "gateway_agent.py"
    assert "agentrl" not in re.sub(r'""".*?"""', "", agent.read_text(), flags=re.S)  # openai client only
    run = tmp_path / "run"
    args = [
        "train",
        "--agent",
        f"{agent}:solve",
        "--env",
        "calculator-v0",
        "--model",
        "tiny",
        "--steps",
        "1",
        "--group-size",
        "2",
        "--groups-per-step",
        "2",
        "--rollout.max-new-tokens",
        "24",
        "--no-progress",
        "--out",
        str(run),
    ]
    out = subprocess.run([*AGENTRL, *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step 0:" in out.stdout
    assert [r["step"] for r in read_metrics(run)] == [0]
    assert json.loads((run / "config.json").read_text())["agent"] == f"{agent}:solve"
    trajs = list(read_trajectories(run))
    assert len(trajs) == 4 and len({t.meta.group_id for t in trajs}) == 2
    assert all(t.meta.task_id.startswith("calculator-v0:") and t.meta.step == 0 for t in trajs)
    assert all(t.meta.extra["source"] == "gateway" and not t.infra_failure for t in trajs)
    assert (run / "checkpoints").is_dir()
    code, check = replay_in_process(capsys, str(run), "--check")
    assert code == 0 and "4 of 4 trajectories consistent" in check, check
    # The agent ran its own tools and reward: nothing of the env to re-execute, and replay says so (exit 3),
    # rather than reporting every episode DIFFERENT (issue 47, point 4).
    code, rex = replay_in_process(capsys, str(run), "--reexec")
    assert code == 3 and "4 not re-executable" in rex, rex
    assert "DIFFERENT" not in rex


def test_gateway_command_refuses_bad_settings(capsys, tmp_path):
    from agentrl.trainers.cli import main

    assert main(["gateway", "--model", "tiny"]) == 2
    assert "--out DIR is required" in capsys.readouterr().err
    assert main(["gateway", "--out", str(tmp_path), "--on-rewrite", "ignore"]) == 2
    assert "--on_rewrite" in capsys.readouterr().err
    assert main(["gateway", "--out", str(tmp_path), "--parser", "xml"]) == 2
    assert "unknown tool-call parser" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text('{"model": "tiny", "env": "calculator-v0"}')
    assert main(["gateway", "--model", "tiny", "--out", str(tmp_path / "run"), "--port", "0"]) == 2
    assert "holds a training run" in capsys.readouterr().err
