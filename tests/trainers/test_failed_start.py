"""A start that fails before recording anything leaves no run folder behind, and the retry just works."""

import json

from agentrl import read_trajectories
from agentrl.run import RunDir
from agentrl.trainers.cli import main as cli_main

TINY = ["--model", "tiny", "--group-size", "2", "--groups-per-step", "1", "--rollout.max-new-tokens", "16"]
# No held-out evaluation: no test here reads it, and its 32 tasks were most of each run's cost.
FAST = [*TINY, "--steps", "1", "--eval.tasks", "0", "--no-progress"]


def test_failed_starts_leave_nothing_and_the_retry_succeeds(tmp_path, capsys):
    run = tmp_path / "runs" / "r"
    # An unknown env (found only once the model is loaded), an env argument it rejects, a model that cannot
    # load: each exits 2 with its error, and the run folder it had made is gone.
    for bad in (
        ["--env", "nope-v0"],
        ["--env-kwargs", '{"difficulty": "x"}'],
        ["--model", str(tmp_path / "no-such-model")],
    ):
        assert cli_main(["train", *FAST, *bad, "--out", str(run)]) == 2, bad
        err = capsys.readouterr().err
        assert "error:" in err and not run.exists(), (bad, err)
    assert "no environment registered as 'nope-v0'" in err or "no such folder" in err
    # The same command with the mistake fixed runs into the same folder without --resume.
    assert cli_main(["train", *FAST, "--out", str(run)]) == 0
    assert len(list(read_trajectories(run))) == 2 and RunDir(run).latest_checkpoint() is not None
    # A started run is still protected.
    assert cli_main(["train", *FAST, "--out", str(run)]) == 2
    assert "already holds a run; pass --resume" in capsys.readouterr().err


def test_a_folder_that_was_there_keeps_only_what_was_in_it(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("the user's own file")
    assert cli_main(["train", *FAST, "--env", "nope-v0", "--out", str(out)]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_start_killed_before_its_first_episode_is_taken_over(tmp_path):
    # What kill -9 during model loading leaves: config.json and nothing else. Nothing in it can be resumed,
    # so a new run (even with other settings) takes the folder over.
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": "tiny", "env": "math-tir-v0", "steps": 9}))
    (run / "metrics.jsonl").write_text("")
    assert not RunDir(run).has_records()
    assert cli_main(["train", *FAST, "--out", str(run)]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["env"] == "math-tir-arith-v0" and saved["output"]["steps"] == 1
    assert RunDir(run).has_records()
