"""calculator: exact arithmetic from a parsed tree, bounded, and nothing but arithmetic."""

from __future__ import annotations

from fractions import Fraction

import pytest

from agentrl import ToolContext, ToolStatus
from agentrl.tools import CalculatorError, calculator, evaluate
from agentrl.tools.calculator import format_number


@pytest.mark.parametrize(
    ("expression", "shown"),
    [
        ("(1234 * 5678 - 91) // 7", "1000937"),
        ("123456789 * 987654321", "121932631112635269"),
        ("2^64", "18446744073709551616"),
        ("7/2", "3.5"),
        ("1/3 + 1/6", "0.5"),
        ("1/3 + 1/9", "4/9"),
        ("2/3", "2/3"),
        ("0.1 + 0.2", "0.3"),
        ("-3 ** 2", "-9"),
        ("17 % 5", "2"),
        ("10 ** -2", "0.01"),
        ("sqrt(144)", "12"),
        ("sqrt(2)", "1.41421356237"),
        ("gcd(84, 126, 210)", "42"),
        ("lcm(4, 6)", "12"),
        ("factorial(20)", "2432902008176640000"),
        ("comb(10, 3)", "120"),
        ("max(3, -1, 7) - min(2, 5)", "5"),
        ("round(2.675, 2)", "2.68"),
        ("abs(-5) × 3 ÷ 5", "3"),
        ("123456789012345678901 / 4", "30864197253086419725.25"),
    ],
)
def test_exact_results(expression, shown):
    assert format_number(evaluate(expression)) == shown


def test_fractions_stay_exact():
    assert evaluate("1/3") == Fraction(1, 3)
    assert evaluate("1/3 * 3") == 1 and isinstance(evaluate("1/3 * 3"), int)


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("9**9**9", "too large"),
        ("factorial(100000)", "too large"),
        ("1/0", "division by zero"),
        ("5 % 0", "modulo by zero"),
        ("0 ** -1", "division by zero"),
        ("10 ** 10000", "too large"),
        ("sqrt(2) * 10**300 * 10**300", "not a finite number"),
        ("sqrt(-1)", "negative"),
        ("(-8) ** (1/3)", "not a real number"),
        ("__import__('os')", "unknown function"),
        ("__import__('os').system('ls')", "unsupported syntax"),
        ("().__class__", "unsupported syntax"),
        ("open('/etc/passwd')", "unknown function"),
        ("x + 1", "unknown name 'x'"),
        ("'a' * 3", "unsupported value"),
        ("[1, 2]", "unsupported syntax"),
        ("lambda: 1", "unsupported syntax"),
        ("gcd(1.5, 2)", "needs integers"),
        ("comb(1)", "wrong number of arguments"),
        ("1 +", "invalid syntax"),
        ("", "empty"),
        ("1+" * 300 + "1", "longer than"),
        ("+".join(["1"] * 150), "too long"),
    ],
)
def test_errors_are_calculator_errors(expression, words):
    with pytest.raises(CalculatorError, match=words.replace("(", r"\(")):
        evaluate(expression)


async def test_the_tool_reports_errors_to_the_model():
    ok = await calculator({"expression": "6*7"}, ToolContext())
    assert ok.content == "42" and ok.status == "ok"
    bad = await calculator({"expression": "6 *"}, ToolContext())
    assert bad.status == ToolStatus.ERROR.value and bad.content.startswith("Error: invalid syntax")
    assert calculator.schema["function"]["parameters"]["required"] == ["expression"]


def test_calculator_errors_are_in_the_error_tree():
    from agentrl import errors

    assert CalculatorError is errors.CalculatorError
    assert issubclass(CalculatorError, errors.ToolCallError) and issubclass(CalculatorError, ValueError)
    with pytest.raises(errors.EpisodeError, match="division by zero"):
        evaluate("1/0")
