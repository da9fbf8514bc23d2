"""The reasoning-gym and textarena env families through the command line: check, envs FAMILY, eval with
--env-kwargs, and a one-step train whose episodes replay --reexec reproduces (the tiny model)."""

from __future__ import annotations

import json

import pytest

from agentrl import read_trajectories
from agentrl.trainers.cli import main

pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra (.ci/setup --dev installs it)")
pytest.importorskip("textarena", reason="the textarena extra (.ci/setup --dev installs it)")

FAST = ["--model", "tiny", "--group-size", "2", "--groups-per-step", "1", "--steps", "1", "--no-progress"]


def test_check_and_the_member_lists(capsys):
    assert main(["check", "--env", "reasoning-gym:leg_counting"]) == 0
    assert main(["check", "--env", "textarena:Sudoku-v0-easy", "--env-kwargs", '{"max_turns": 20}']) == 0
    out = capsys.readouterr().out
    assert "reasoning-gym:leg_counting: agentrl check_env passed" in out
    assert "textarena:Sudoku-v0-easy: Gymnasium check_env passed" in out
    assert main(["envs", "textarena"]) == 0
    assert "textarena:TowerOfHanoi-v0\n" in capsys.readouterr().out
    assert main(["check", "--env", "textarena:Wordle-v0"]) == 2
    assert "NLTK's 'words' corpus" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_takes_env_kwargs(capsys):
    argv = ["eval", "--model", "tiny", "--env", "reasoning-gym:chain_sum", "--tasks", "2", "--k", "1"]
    assert main([*argv, "--env-kwargs", '{"max_terms": 2}', "--max-new-tokens", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (
        report["env"] == "reasoning-gym:chain_sum" and report["episodes"] == 2 and report["split"] == "test"
    )
    assert main([*argv, "--env-kwargs", "[1]"]) == 2
    assert "--env-kwargs must be a JSON object" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "kwargs"),
    [("reasoning-gym:chain_sum", '{"python": true}'), ("textarena:GuessTheNumber-v0", "{}")],
)
def test_train_one_step_then_replay_reexec_and_eval_the_run(tmp_path, capsys, env, kwargs):
    run = tmp_path / "run"
    argv = ["train", *FAST, "--env", env, "--env-kwargs", kwargs, "--eval.tasks", "0", "--out", str(run)]
    assert main([*argv, "--rollout.max-new-tokens", "8", "--rollout.max-turns", "2"]) == 0, (
        capsys.readouterr().err
    )
    config = json.loads((run / "config.json").read_text())
    assert config["env"] == env and config["env_kwargs"] == json.loads(kwargs)
    trajectories = list(read_trajectories(run))
    assert trajectories and all(t.meta.env_id == env for t in trajectories)
    capsys.readouterr()
    assert main(["replay", str(run), "--reexec", "--rescore"]) == 0, capsys.readouterr().err
    assert "rewards reproduced" in capsys.readouterr().out
    assert main(["eval", "--model", str(run), "--tasks", "1", "--k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["env"] == env
