"""The held-out evaluation's statistics: bootstrap intervals over tasks and the paired gain."""

import pytest

from agentrl.errors import ConfigError
from agentrl.trainers.evaluate import EvalConfig, EvalReport, bootstrap_interval, paired_gain


def _report(successes: list[int], samples: int = 4) -> EvalReport:
    n = len(successes)
    return EvalReport(
        env="e",
        split="test",
        tasks=n,
        samples_per_task=samples,
        pass_at_1=sum(successes) / (n * samples),
        pass_at_k=0.0,
        mean_reward=0.0,
        infra_failures=0,
        task_ids=tuple(f"e:{i}" for i in range(n)),
        task_successes=tuple(successes),
        task_samples=(samples,) * n,
    )


def test_bootstrap_interval_covers_the_estimate_and_narrows_with_more_tasks():
    few = bootstrap_interval([0, 4, 2, 1], [4] * 4)
    many = bootstrap_interval([0, 4, 2, 1] * 16, [4] * 64)
    for lo, hi in (few, many):
        assert lo < 7 / 16 < hi
    assert many[1] - many[0] < (few[1] - few[0]) / 2  # ~1/sqrt(16) as wide
    assert bootstrap_interval([3, 3], [3, 3]) == (1.0, 1.0)
    assert bootstrap_interval([0, 4, 2, 1], [4] * 4) == few  # fixed resampling seed
    with pytest.raises(ConfigError):
        bootstrap_interval([1], [1, 2])


def test_tasks_not_episodes_are_the_units():
    """All-or-nothing tasks: 8 tasks x 16 samples is 128 episodes, but only 8 independent outcomes."""
    lo, hi = bootstrap_interval([16, 0] * 4, [16] * 8)
    assert hi - lo > 0.4  # a binomial interval over 128 episodes would be ~0.17 wide


def test_paired_gain_uses_the_per_task_differences():
    before = _report([0, 1, 2, 0, 1, 0, 2, 1])
    after = _report([2, 3, 4, 2, 3, 2, 4, 3])  # every task +2 of 4
    gain = paired_gain(before, after)
    assert gain.tasks == 8 and gain.gain == pytest.approx(0.5)
    assert gain.low == pytest.approx(0.5) and gain.high == pytest.approx(0.5)  # no spread in the pairs
    noisy = paired_gain(before, _report([1, 1, 2, 0, 4, 0, 2, 1]))
    assert noisy.low < noisy.gain < noisy.high
    with pytest.raises(ConfigError, match="share no task"):
        paired_gain(before, EvalReport("e", None, 0, 4, 0, 0, 0, 0))


def test_eval_config_is_validated():
    assert EvalConfig(tasks=0).tasks == 0  # off
    for bad in ({"tasks": -1}, {"samples": 0}, {"tasks": 1.5}):
        with pytest.raises(ConfigError, match="--eval"):
            EvalConfig(**bad)
