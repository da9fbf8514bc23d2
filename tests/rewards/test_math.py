"""grade_math: math-verify's equivalences, zero scores with reasons (never a crash), timeouts in and out of
the main thread, and math-tir-v0 grading with it."""

import signal
import threading
import time
from fractions import Fraction

import pytest

from agentrl.errors import ConfigError
from agentrl.rewards import Grade, grade_math


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("17273", 17273),
        ("17,273", 17273),
        ("17273.", 17273),
        ("\\boxed{7}", 7),
        ("x = 5", 5),
        ("\u22123", -3),
        ("\\frac{1}{2}", Fraction(1, 2)),
        ("\\dfrac{5}{6}", Fraction(5, 6)),
        ("3/6", Fraction(1, 2)),
        ("0.5", Fraction(1, 2)),
        ("2.9444444444444446", Fraction(53, 18)),  # print(53 / 18) in the python tool
        ("2^{10}", 1024),
        ("\\{1, 2\\}", "\\{2, 1\\}"),
        ("[1, 2)", "[1, 2)"),
        ("10\\%", "0.1"),
    ],
)
def test_equal_answers_score_one(answer, gold):
    assert grade_math(answer, gold) == Grade(1.0, "equal")


@pytest.mark.parametrize(
    ("answer", "gold", "reason"),
    [
        ("17274", 17273, "not equal"),
        ("(1, 2]", "[1, 2)", "not equal"),
        ("0.29", Fraction(2, 7), "not equal"),
        (None, 3, "no answer"),
        ("   ", 3, "no answer"),
        ("}{", 3, "no parsable answer"),
    ],
)
def test_wrong_or_unparsable_answers_score_zero_with_a_reason(answer, gold, reason):
    g = grade_math(answer, gold)
    assert g.score == 0.0 and g.reason.startswith(reason), g


def test_a_comparison_past_the_limit_is_a_zero_score_not_a_hang():
    t0 = time.perf_counter()
    g = grade_math("10^{10^{10^{10}}}", 5, timeout=0.5)
    assert g.score == 0.0 and g.reason.startswith("timed out"), g
    assert time.perf_counter() - t0 < 5


def test_an_outer_alarm_survives_the_grader_timer():
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 3.0)
        assert grade_math("1/2", Fraction(1, 2)).score == 1.0
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left < 3.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not fired


def test_off_the_main_thread_grading_runs_in_a_worker_process_with_its_timeout():
    out: list[Grade] = []

    def work():
        out.append(grade_math("\\frac{3}{4}", Fraction(3, 4)))
        out.append(grade_math("10^{10^{10^{10}}}", 5, timeout=0.5))
        out.append(grade_math("0.75", Fraction(3, 4)))  # a fresh worker after the timed-out one

    t = threading.Thread(target=work)
    t.start()
    t.join(120)
    assert [g.score for g in out] == [1.0, 0.0, 1.0]
    assert out[1].reason.startswith("timed out")


def test_bad_gold_or_timeout_is_a_config_error():
    with pytest.raises(ConfigError, match="gold"):
        grade_math("1", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout"):
        grade_math("1", 1, timeout=0)
    with pytest.raises(ConfigError, match="cannot parse the gold"):
        grade_math("1", "}{")


def test_math_tir_grades_with_math_verify_and_records_the_term():  # in the main thread: no worker
    import asyncio

    from agentrl.envs.math_tir import MathTIREnv
    from agentrl.testing import FakeSandbox
    from agentrl.types import Action

    async def episode(text: str):
        env = MathTIREnv(kinds=("fractions",), sandbox_factory=FakeSandbox, format_reward=0.1)
        await env.reset(seed=3)
        gold = env.task.answer
        result = await env.step(Action(text=text.format(a=gold.numerator, b=gold.denominator)))
        await env.close()
        return result

    right = asyncio.run(episode("Answer: \\frac{{{a}}}{{{b}}}"))
    assert right.reward == 1.0 and [(t.name, t.score, t.reason) for t in right.reward_terms] == [
        ("math", 1.0, "equal")
    ]
    wrong = asyncio.run(episode("Answer: {b}/{a}7"))
    assert wrong.reward == 0.1 and wrong.reward_terms[0].reason.startswith("format reward: not equal")
