"""``agentrl train --agent`` with agents written against the other two APIs: the OpenAI Agents SDK
(Responses) and the anthropic SDK (Messages), from examples/. Each trains a step and replays."""

from __future__ import annotations

import re

import pytest

from agentrl import read_trajectories
from agentrl.metrics import read_metrics

from .test_cli import ROOT, replay_in_process


@pytest.mark.slow
@pytest.mark.parametrize(
    ("example", "api"), [("responses_agent", "responses"), ("anthropic_agent", "anthropic")]
)
def test_train_an_sdk_agent_for_one_step_and_replay(tmp_path, capsys, example, api):
    """The training and the replay call the CLI's ``main`` in this process: loading an agent from its file
    in a fresh ``python -m agentrl.trainers`` is test_cli.py's claim (the openai-client agent); here a fresh
    interpreter's imports of torch and transformers would be most of the CPU time and prove nothing more."""
    from agentrl.trainers.cli import main

    agent = ROOT / "examples" / f"{example}.py"
    assert "agentrl" not in re.sub(r'""".*?"""', "", agent.read_text(), flags=re.S)  # its SDK only
    run = tmp_path / "run"
    args = ["train", "--agent", f"{agent}:solve", "--env", "calculator-v0", "--model", "tiny", "--steps", "1"]
    args += ["--group-size", "2", "--groups-per-step", "1", "--rollout.max-new-tokens", "24", "--no-progress"]
    code = main([*args, "--out", str(run)])
    assert code == 0, capsys.readouterr().err[-3000:]
    assert [r["step"] for r in read_metrics(run)] == [0]
    trajs = list(read_trajectories(run))
    assert len(trajs) >= 2 and all(t.meta.extra["source"] == "gateway" and not t.infra_failure for t in trajs)
    assert all(t.meta.task_id.startswith("calculator-v0:") and t.meta.step == 0 for t in trajs)
    code, check = replay_in_process(capsys, str(run), "--check")
    n = len(trajs)
    assert code == 0 and f"{n} of {n} trajectories consistent" in check, check
