"""Answer extraction (\\boxed{}, Answer: lines) and exact number parsing."""

from __future__ import annotations

from fractions import Fraction

import pytest

from agentrl.tools import extract_answer, parse_number, same_number


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Answer: 42", "42"),
        ("work...\nanswer:  -7 ", "-7"),
        ("**Answer:** 1,234", "1,234"),
        ("Final answer: 3/4", "3/4"),
        ("The answer is 5.", "5."),
        ("Answer：9", "9"),
        ("Answer: 1\nAnswer: 2", "2"),
        ("so \\boxed{12} and that is it", "12"),
        ("\\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("Answer: 3 but really \\boxed{4}", "4"),
        ("```python\nprint('Answer: 1')\n```", None),
        ("```python\nx = '\\boxed{1}'\n```\nAnswer: 2", "2"),
        ("no answer here", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ("42", 42),
        ("-7", -7),
        ("+3", 3),
        ("1,234,567", 1234567),
        ("2.50", Fraction(5, 2)),
        ("3/4", Fraction(3, 4)),
        ("-6/8", Fraction(-3, 4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("-\\dfrac{10}{4}", Fraction(-5, 2)),
        ("$17$", 17),
        ("5.", 5),
        ("(5)", 5),
        ("\u22125", -5),
        ("x = 12", 12),
        ("12 apples", 12),
        ("12, since 3 * 4 = 12", 12),
        ("12. Done", 12),
        ("\\boxed{8}", 8),
    ],
)
def test_parse_number_reads_exact_values(answer, value):
    assert parse_number(answer) == value


@pytest.mark.parametrize("answer", [None, "", "twelve", "3 or 4", "1/0", "1,23", "3.4.5", "1.2.3 apples"])
def test_parse_number_rejects_non_numbers_and_ambiguity(answer):
    assert parse_number(answer) is None


def test_same_number_is_exact():
    assert same_number("0.75", Fraction(3, 4)) and same_number("6/8", Fraction(3, 4))
    assert not same_number("0.7500001", Fraction(3, 4))
    assert same_number("123456789123456789", 123456789123456789)
    assert not same_number("123456789123456788", 123456789123456789)
