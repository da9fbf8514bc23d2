"""`agentrl train --env long-chain-v0` runs a step from the CLI in each context mode (tiny model), and every
trajectory it stores carries the sample links."""

import json
import subprocess
import sys

import pytest

from agentrl import read_trajectories

AGENTRL = [sys.executable, "-m", "agentrl.trainers"]


@pytest.mark.parametrize("mode", ["env-compaction", "policy-compaction", "truncate"])
def test_one_step_from_the_cli(tmp_path, mode):
    run = tmp_path / "run"
    kwargs = json.dumps({"context": mode, "k": 6, "compact_every": 2})
    cmd = [
        *AGENTRL, "train", "--env", "long-chain-v0", "--env-kwargs", kwargs, "--model", "tiny",
        "--group-size", "2", "--groups-per-step", "1", "--rollout.max-new-tokens", "16",
        "--rollout.max-total-tokens", "160", "--eval.tasks", "0", "--no-progress", "--steps", "1",
        "--out", str(run),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step 0:" in out.stdout
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
