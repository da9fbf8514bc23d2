"""Reward terms and judge calls as records: validation, the JSON round trip, StepResult's sum check, the
replay transcript that shows them, and the step metrics that log them."""

import dataclasses

import pytest

from agentrl.env import StepResult
from agentrl.errors import EnvContractError, FormatError
from agentrl.replay.terminal import render
from agentrl.reward_records import JudgeCall, RewardTerm, weighted_total
from agentrl.trainers.step_metrics import episode_metrics
from agentrl.types import Trajectory

CALL = JudgeCall("m@http://j/v1", "Q: sea?\nA: blue", "Score: 8", 0.8, 1.25, "k" * 64, attempts=2)
TERMS = (RewardTerm("judge", 0.8, 0.5, "judge: 0.8", 0, (CALL,)), RewardTerm("brief", 1.0, 0.5, "3 words", 0))


def test_terms_validate_and_sum():
    assert weighted_total(TERMS) == pytest.approx(0.9)
    with pytest.raises(FormatError):
        RewardTerm("", 1.0)
    with pytest.raises(FormatError):
        RewardTerm("x", float("nan"))
    assert StepResult(reward=0.9, reward_terms=TERMS).reward_terms == TERMS
    with pytest.raises(EnvContractError, match="not the weighted sum"):
        StepResult(reward=1.0, reward_terms=TERMS)


def _traj(terms=TERMS, reward=0.9) -> Trajectory:
    base = Trajectory.from_dict(
        {
            "token_ids": [1, 2],
            "loss_mask": [0, 1],
            "logprobs": [None, -0.5],
            "segments": [
                {"source": "prompt", "start": 0, "end": 1, "turn": -1},
                {"source": "model", "start": 1, "end": 2, "turn": 0},
            ],
            "messages": [{"role": "user", "content": "sea?"}, {"role": "assistant", "content": "blue"}],
            "rewards": [reward],
            "terminated": True,
            "truncated": False,
        }
    )
    return dataclasses.replace(base, reward_terms=terms)


def test_round_trip_and_old_records_unchanged():
    t = _traj()
    assert Trajectory.from_dict(t.to_dict()) == t
    assert "reward_terms" not in _traj(terms=()).to_dict()


def test_replay_transcript_shows_why():
    text = render(_traj())
    assert "term judge (turn 0): 0.8 x 0.5  judge: 0.8" in text
    assert "judge m@http://j/v1 (1.25s, 2 attempt(s)) -> 0.8" in text
    assert "prompt: Q: sea?" in text and "answer: Score: 8" in text


def test_step_metrics_log_each_term_and_the_judge_calls():
    cached = dataclasses.replace(CALL, cached=True, attempts=0, latency_s=0.0)
    other = (RewardTerm("judge", 0.2, 0.5, "", 0, (cached,)), RewardTerm("brief", 0.0, 0.5, "", 0))
    row = episode_metrics([_traj(), _traj(other, 0.1)])
    assert row["reward/term/judge"] == pytest.approx(0.5) and row["reward/term/brief"] == pytest.approx(0.5)
    assert (row["judge/calls"], row["judge/cached"], row["judge/latency_s"]) == (1.0, 1.0, 1.25)
    assert "reward/term/judge" not in episode_metrics([_traj(terms=())])
