"""`agentrl train --env long-chain-v0` runs a step from the CLI in each context mode (tiny model), and every
trajectory it stores carries the sample links.

One mode runs ``python -m agentrl.trainers`` in a fresh process (the env is found by its id with nothing
imported beforehand); the other two call the same CLI ``main`` in this process, which spares each of them a
fresh interpreter's imports of torch and transformers (most of such a run's CPU time)."""

import json
import subprocess
import sys

import pytest

from agentrl import read_trajectories
from agentrl.trainers.cli import main as cli_main

AGENTRL = [sys.executable, "-m", "agentrl.trainers"]


@pytest.mark.parametrize(
    ("mode", "fresh_process"),
    [
        pytest.param(m, m == "env-compaction", id=m)
        for m in ("env-compaction", "policy-compaction", "truncate")
    ],
)
def test_one_step_from_the_cli(tmp_path, capsys, mode, fresh_process):
    run = tmp_path / "run"
    kwargs = json.dumps({"context": mode, "k": 6, "compact_every": 2})
    args = [
        "train", "--env", "long-chain-v0", "--env-kwargs", kwargs, "--model", "tiny",
        "--group-size", "2", "--groups-per-step", "1", "--rollout.max-new-tokens", "16",
        "--rollout.max-total-tokens", "160", "--eval.tasks", "0", "--no-progress", "--steps", "1",
        "--out", str(run),
    ]  # fmt: skip
    if fresh_process:
        out = subprocess.run([*AGENTRL, *args], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        stdout = out.stdout
    else:
        assert cli_main(args) == 0
        stdout = capsys.readouterr().out
    assert "step 0:" in stdout
    config = json.loads((run / "config.json").read_text())
    assert config["env"] == "long-chain-v0" and config["env_kwargs"]["context"] == mode
    trajs = list(read_trajectories(run / "trajectories.jsonl"))
    assert len(trajs) >= 2
    for t in trajs:
        assert 0 <= t.meta.sample_index < t.meta.num_samples
    lines = (run / "trajectories.jsonl").read_text().splitlines()
    metas = [json.loads(x)["meta"] for x in lines]
    # the sample keys are written exactly for episodes of several samples (older readers see the rest as is)
    assert all(("sample_index" in m) == (m.get("num_samples", 1) > 1) for m in metas)
