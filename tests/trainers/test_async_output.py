"""What an asynchronous run tells its user (issue #32): the token-limit warning of synchronous runs, the
rollout time shown as "overlapped" with the generation time that happened, and plots of staleness,
correction, generation time and the evaluation (labelled by split)."""

from __future__ import annotations

import json

import pytest

from agentrl.metrics import read_metrics
from agentrl.trainers.cli import main
from agentrl.trainers.step_metrics import format_async_row


def test_an_overlapped_rollout_says_so_and_shows_the_generation_time():
    row = {
        "reward/mean": 0.5,
        "time/rollout_s": 1.82e-05,
        "time/generate_s": 2.5,
        "async/learner_idle_frac": 0.0,
    }
    line = format_async_row(3, row, staleness=1)
    assert line.startswith("step 3: reward=0.5")
    assert "rollout_s=overlapped generate_s=2.5 staleness=1 idle=0.00" in line
    assert "1.82e-05" not in line
    row["time/rollout_s"] = 1.2  # the learner waited: that wait is the number shown
    assert "rollout_s=1.2 generate_s=2.5" in format_async_row(3, row, staleness=0)


@pytest.mark.slow
def test_async_run_warns_about_token_limits_and_plots_what_it_measured(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--model", "tiny", "--env", "calculator-v0", "--max-staleness", "1", "--steps", "2"]
    argv += ["--group-size", "2", "--groups-per-step", "2", "--rollout.max-new-tokens", "4", "--no-progress"]
    argv += ["--eval.tasks", "1", "--eval.samples", "1", "--out", str(run)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    # A random model never ends a turn within 4 tokens: every episode is cut, and the run says so.
    assert "step 0: warning: 4 of 4 episodes ended at a token limit" in err, err
    assert "Raise --rollout.max-new-tokens (now 4)" in err
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all("generate_s=" in line and "rollout_s=" in line for line in steps)
    rows = read_metrics(run)
    assert all(r["time/generate_s"] > 0 for r in rows)
    # calculator-v0 has no test split: the evaluation says its tasks are not held out.
    assert "eval (the env has no test split, so these tasks are not held out), untrained" in out
    assert "(all tasks, no test split)" in out and "held-out pass@1" not in out
    assert json.loads((run / "eval.json").read_text())["trained"]["split"] is None
    assert main(["plot", str(run)]) == 0
    written = {p.rsplit("/", 1)[-1] for p in capsys.readouterr().out.split()}
    assert {"reward.png", "time.png", "staleness.png", "correction.png", "held_out.png"} <= written
