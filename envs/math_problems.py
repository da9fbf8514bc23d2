"""Procedurally generated math problems with exact answers, for tool-integrated reasoning.

Eight kinds, each at three difficulty levels, chosen so that running Python helps: big-number arithmetic,
word problems, gcd/lcm, modular arithmetic, digit sums, counting primes, counting divisors, and fraction
sums. Every answer is an ``int`` or a :class:`~fractions.Fraction`, computed here exactly.

Train/test split: a problem belongs to the held-out ``test`` split when the SHA-256 of its question text
falls in the lowest :data:`TEST_PERCENT` percent, else to ``train``. :func:`sample` draws until it hits the
requested split, so the two splits never share a question, whatever the seeds.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from agentrl.errors import ConfigError

__all__ = ["KINDS", "SPLITS", "TEST_PERCENT", "Problem", "generate", "sample", "split_of"]

TEST_PERCENT = 20
SPLITS = ("train", "test")


@dataclass(frozen=True, slots=True)
class Problem:
    """One generated problem."""

    kind: str
    """Generator name (``arithmetic``, ``word``, ``gcd_lcm``, ...)."""
    difficulty: int
    """1 (easy) to 3 (hard)."""
    question: str
    """The question shown to the model."""
    answer: int | Fraction
    """The exact answer."""

    @property
    def task_id(self) -> str:
        """A stable id: the first 12 hex digits of the question's SHA-256."""
        return _digest(self.question)[:12]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def split_of(question: str) -> str:
    """``"test"`` for the held-out slice of question space, else ``"train"``."""
    return "test" if int(_digest(question)[:8], 16) % 100 < TEST_PERCENT else "train"


def _digits(rng: random.Random, n: int) -> int:
    return rng.randint(10 ** (n - 1), 10**n - 1)


def _arithmetic(rng: random.Random, d: int) -> tuple[str, int]:
    if d == 1:
        a, b, c = _digits(rng, 3), _digits(rng, 2), _digits(rng, 3)
        return f"What is {a} * {b} - {c}?", a * b - c
    if d == 2:
        a, b, c, e, f = (_digits(rng, 4) for _ in range(5))
        return f"What is {a} * {b} + {c} * {e} - {f}?", a * b + c * e - f
    a, b, c, e = _digits(rng, 6), _digits(rng, 5), _digits(rng, 7), _digits(rng, 3)
    return f"What is ({a} * {b} - {c}) * {e}?", (a * b - c) * e


def _word(rng: random.Random, d: int) -> tuple[str, int]:
    size = (2, 3, 4)[d - 1]
    x, y, z = _digits(rng, size), _digits(rng, size), _digits(rng, size + 1)
    form = rng.randrange(4)
    if form == 0:
        return (
            f"A farmer packs {x} crates with {y} apples each, then sells {z} apples. "
            "How many apples are left?",
            x * y - z,
        )
    if form == 1:
        w = _digits(rng, size)
        return (
            f"A train travels at {x} km/h for {y} hours, then at {w} km/h for {z} hours. "
            "How many kilometres does it travel in total?",
            x * y + w * z,
        )
    if form == 2:
        name = rng.choice(("Ada", "Ben", "Chen", "Dara", "Eli", "Farah"))
        return (
            f"{name} saves {x} dollars every week for {y} weeks and then spends {z} dollars. "
            "How many dollars are left?",
            x * y - z,
        )
    box = rng.randint(7, 10**size)
    return (
        f"A factory makes {x} parts per hour for {y} hours. The parts are packed in boxes of {box}. "
        "How many boxes can be filled completely?",
        x * y // box,
    )


def _gcd_lcm(rng: random.Random, d: int) -> tuple[str, int]:
    if d == 1:
        g = rng.randint(2, 40)
        a, b = g * rng.randint(2, 30), g * rng.randint(2, 30)
        return f"What is the greatest common divisor of {a} and {b}?", math.gcd(a, b)
    if d == 2:
        a, b, c = (rng.randint(12, 400) for _ in range(3))
        return f"What is the least common multiple of {a}, {b} and {c}?", math.lcm(a, b, c)
    g = _digits(rng, 4)
    a, b = g * _digits(rng, 5), g * _digits(rng, 5)
    return f"What is the greatest common divisor of {a} and {b}?", math.gcd(a, b)


def _modular(rng: random.Random, d: int) -> tuple[str, int]:
    m = rng.randint(7, (97, 997, 9973)[d - 1])
    if d == 1:
        a = _digits(rng, 6)
        return f"What is the remainder when {a} is divided by {m}?", a % m
    if d == 2:
        a, b = _digits(rng, 5), _digits(rng, 5)
        return f"What is the remainder when {a} * {b} is divided by {m}?", a * b % m
    a, e = rng.randint(2, 999), rng.randint(100, 9999)
    return f"What is {a}^{e} mod {m}? (Here ^ means power.)", pow(a, e, m)


def _digit_sum(rng: random.Random, d: int) -> tuple[str, int]:
    if d == 3:
        n = rng.randint(20, 80)
        return f"What is the sum of the digits of {n}! ({n} factorial)?", sum(
            map(int, str(math.factorial(n)))
        )
    base, k = rng.choice((2, 3, 7)), rng.randint(*((15, 60), (60, 300))[d - 1])
    return f"What is the sum of the digits of {base}^{k}? (Here ^ means power.)", sum(map(int, str(base**k)))


def _count_primes(rng: random.Random, d: int) -> tuple[str, int]:
    hi = (200, 5_000, 100_000)[d - 1]
    a = rng.randint(1, hi // 2)
    b = rng.randint(a + 10, hi)
    return f"How many prime numbers are there between {a} and {b} inclusive?", _primes_in(a, b)


def _primes_in(a: int, b: int) -> int:
    sieve = bytearray([1]) * (b + 1)
    sieve[:2] = b"\x00\x00"
    for p in range(2, math.isqrt(b) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(range(p * p, b + 1, p)))
    return sum(sieve[a:])


def _divisors(rng: random.Random, d: int) -> tuple[str, int]:
    if d == 3:  # a product of small prime powers: many divisors, too big to list by hand
        n = 1
        for p in (2, 3, 5, 7, 11, 13):
            n *= p ** rng.randint(0, 4)
        n = max(n, 2 * 3 * 5 * 7)
    else:
        n = rng.randint(12, (500, 100_000)[d - 1])
    count, m, p = 1, n, 2
    while p * p <= m:
        e = 0
        while m % p == 0:
            m, e = m // p, e + 1
        count *= e + 1
        p += 1
    count *= 2 if m > 1 else 1
    return f"How many positive divisors does {n} have?", count


def _fractions(rng: random.Random, d: int) -> tuple[str, Fraction]:
    top = (9, 30, 200)[d - 1]
    terms = [Fraction(rng.randint(1, top), rng.randint(2, top)) for _ in range(d + 1)]
    signs = [1] + [rng.choice((1, -1)) for _ in terms[1:]]
    text = f"{terms[0].numerator}/{terms[0].denominator}"
    for s, t in zip(signs[1:], terms[1:], strict=True):
        text += f" {'+' if s > 0 else '-'} {t.numerator}/{t.denominator}"
    value = sum((s * t for s, t in zip(signs, terms, strict=True)), Fraction(0))
    return f"What is {text}? Give the answer as a fraction in lowest terms.", value


KINDS: dict[str, Callable[[random.Random, int], tuple[str, int | Fraction]]] = {
    "arithmetic": _arithmetic,
    "word": _word,
    "gcd_lcm": _gcd_lcm,
    "modular": _modular,
    "digit_sum": _digit_sum,
    "count_primes": _count_primes,
    "divisors": _divisors,
    "fractions": _fractions,
}
"""Problem generators by kind: ``generator(rng, difficulty) -> (question, answer)``."""


def generate(
    rng: random.Random, kinds: Sequence[str] | None = None, difficulty: int | None = None
) -> Problem:
    """One problem of a random kind among ``kinds`` (default: all) at ``difficulty`` (default: random)."""
    kind = rng.choice(sorted(kinds or KINDS))
    level = difficulty if difficulty is not None else rng.randint(1, 3)
    question, answer = KINDS[kind](rng, level)
    return Problem(kind, level, question, answer)


def sample(
    rng: random.Random,
    split: str = "train",
    kinds: Sequence[str] | None = None,
    difficulty: int | None = None,
) -> Problem:
    """A problem from ``split``: draw until the question hashes into it (about 1.25 draws for train, 5 for
    test), so a fixed seed still gives a fixed problem."""
    check(split, kinds, difficulty)
    for _ in range(10_000):
        problem = generate(rng, kinds, difficulty)
        if split_of(problem.question) == split:
            return problem
    raise ConfigError(f"could not draw a {split!r} problem for kinds={kinds} difficulty={difficulty}")


def check(split: str, kinds: Sequence[str] | None, difficulty: int | None) -> None:
    """Raise :class:`ConfigError` for an unknown split, kind or difficulty."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    unknown = sorted(set(kinds or ()) - set(KINDS))
    if unknown or (kinds is not None and not kinds):
        raise ConfigError(f"unknown problem kinds {unknown or kinds!r}; known: {sorted(KINDS)}")
    if difficulty is not None and difficulty not in (1, 2, 3):
        raise ConfigError(f"difficulty must be 1, 2, 3 or None (mixed), got {difficulty!r}")
