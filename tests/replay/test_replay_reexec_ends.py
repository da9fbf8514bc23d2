"""``replay --reexec`` on episodes the rollout itself cut (issue #32): every episode of the tiny run is one
turn cut at ``max_new_tokens``, recorded truncated; the env never saw that turn, so the replay's end
``(False, False)`` is the expected one and is labelled so, and the trajectories are not said to lack
actions from an older format. An end that really differs is a difference (exit 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.trainers.cli import main

from .helpers import copy_run

pytestmark = pytest.mark.slow


def test_rollout_cut_episodes_replay_as_expected(tiny_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tiny_run), "--reexec"]) == 0
    out = capsys.readouterr().out
    assert "record no actions" not in out and "end (terminated, truncated): recorded" not in out
    assert out.count("all identical") == 8 and "DIFFERENT" not in out
    assert out.count("no model turn reached the env (each was cut by a token limit)") == 8
    assert "reexec: 8 of 8 trajectories replayed identically" in out
    assert "8 of them were ended by the rollout's own limit" in out and "as expected" in out


def test_an_end_the_env_should_have_reported_is_a_difference(
    tiny_run: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def env_cut(i: int, rec: dict[str, Any]) -> dict[str, Any]:
        if i == 0:
            rec["stop_reason"] = "env_truncated"  # as if the env itself had truncated the episode
        return rec

    forged = copy_run(tiny_run, tmp_path / "forged", edit=env_cut)
    assert main(["replay", str(forged), "--reexec"]) == 1
    out = capsys.readouterr().out
    assert "trajectory 0 " in out and "DIFFERENT" in out
    assert (
        "end (terminated, truncated): recorded (False, True), expected (False, True), replayed (False, False)"
        in out
    )
    assert "reexec: 7 of 8 trajectories replayed identically" in out
