"""Procedurally generated function-writing tasks for ``code-tests-v0``: a statement, visible examples and
hidden tests, with a reference solution whose outputs are the expected values.

Each family is a parameterised statement (``affine`` with ``a, b``; ``caesar`` with a shift; ...), giving
:data:`N_TASKS` distinct tasks (the family is drawn first, uniformly, then its parameters). A task's split
is a hash of its id (about one in five is ``test``), so the
held-out tasks never change with the seed. Test inputs are drawn from the episode's ``random.Random``; the
expected outputs are computed here by running the reference solution on the host (trusted code), so the
examples and tests always agree with it.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.errors import ConfigError

__all__ = ["FAMILIES", "N_TASKS", "CodeTask", "check_split", "sample", "split_of", "task_ids"]

Args = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Family:
    """A parameterised task: how to state it, solve it and draw inputs for it."""

    name: str
    """Also the function's name."""
    signature: str
    """The parameters, e.g. ``x`` or ``s, n``."""
    params: tuple[tuple[Any, ...], ...]
    """Every parameter tuple of the family (one task each)."""
    statement: Callable[..., str]
    """The task's sentence for a parameter tuple."""
    solution: Callable[..., str]
    """The reference body (source of ``return ...``) for a parameter tuple."""
    draw: Callable[[random.Random], Args]
    """One random argument tuple."""


def _ints(rng: random.Random, lo: int = -20, hi: int = 20, n: tuple[int, int] = (0, 7)) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(*n))]


def _word(rng: random.Random, n: tuple[int, int] = (0, 9)) -> str:
    return "".join(rng.choice("abcdefghij xyz") for _ in range(rng.randint(*n))).strip() or "abc"


FAMILIES: tuple[Family, ...] = (
    Family(
        "affine",
        "x",
        tuple(itertools.product(range(2, 13), range(-7, 8))),
        lambda a, b: f"returns {a} * x + ({b}) for an integer x",
        lambda a, b: f"return {a} * x + ({b})",
        lambda rng: (rng.randint(-50, 50),),
    ),
    Family(
        "sum_multiples",
        "nums",
        tuple((k,) for k in range(2, 10)),
        lambda k: f"returns the sum of the numbers in the list nums that are divisible by {k}",
        lambda k: f"return sum(n for n in nums if n % {k} == 0)",
        lambda rng: (_ints(rng),),
    ),
    Family(
        "count_char",
        "s",
        tuple((c,) for c in "abcdefghijxyz"),
        lambda c: f"returns how many times the letter '{c}' occurs in the string s",
        lambda c: f"return s.count({c!r})",
        lambda rng: (_word(rng, (0, 14)),),
    ),
    Family(
        "clamp",
        "x",
        tuple((lo, hi) for lo in range(-6, 4, 2) for hi in range(5, 30, 5)),
        lambda lo, hi: (
            f"returns x limited to the range {lo} to {hi} (smaller values become {lo}, larger {hi})"
        ),
        lambda lo, hi: f"return max({lo}, min({hi}, x))",
        lambda rng: (rng.randint(-40, 40),),
    ),
    Family(
        "greater_than",
        "nums",
        tuple((t,) for t in range(-10, 16)),
        lambda t: f"returns a list of the numbers in nums that are greater than {t}, in their order",
        lambda t: f"return [n for n in nums if n > {t}]",
        lambda rng: (_ints(rng),),
    ),
    Family(
        "caesar",
        "s",
        tuple((k,) for k in range(1, 26)),
        lambda k: (
            f"shifts each lowercase letter of s forward by {k} in the alphabet (z wraps to a); other "
            "characters stay"
        ),
        lambda k: f"return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)",
        lambda rng: (_word(rng),),
    ),
    Family(
        "digit_power_sum",
        "n",
        tuple((p,) for p in range(1, 5)),
        lambda p: (
            f"returns the sum of the decimal digits of the non-negative integer n, each raised to the "
            f"power {p}"
        ),
        lambda p: f"return sum(int(d) ** {p} for d in str(n))",
        lambda rng: (rng.randint(0, 10**6),),
    ),
    Family(
        "long_words",
        "sentence",
        tuple((n,) for n in range(1, 7)),
        lambda n: f"returns how many words of the sentence (split on spaces) have more than {n} letters",
        lambda n: f"return sum(len(w) > {n} for w in sentence.split())",
        lambda rng: (" ".join(_word(rng, (1, 9)) for _ in range(rng.randint(0, 6))),),
    ),
    Family(
        "fizzbuzz",
        "x",
        tuple((a, b) for a in range(2, 6) for b in range(a + 1, 8)),
        lambda a, b: (
            f"returns 'FizzBuzz' if x is divisible by both {a} and {b}, 'Fizz' if only by {a}, "
            f"'Buzz' if only by {b}, else str(x)"
        ),
        lambda a, b: (
            f"return 'FizzBuzz' if x % {a} == 0 and x % {b} == 0 else 'Fizz' if x % {a} == 0 "
            f"else 'Buzz' if x % {b} == 0 else str(x)"
        ),
        lambda rng: (rng.randint(1, 100),),
    ),
    Family(
        "repeat_join",
        "s, n",
        tuple((sep,) for sep in ("-", ",", "+", " ", "|", ":", ".", "")),
        lambda sep: f"returns n copies of the string s joined by {sep!r}",
        lambda sep: f"return {sep!r}.join([s] * n)",
        lambda rng: (rng.choice(string.ascii_lowercase) * rng.randint(1, 3), rng.randint(0, 4)),
    ),
    Family(
        "kth_largest",
        "nums",
        tuple((k,) for k in range(1, 4)),
        lambda k: (
            f"returns the {['', 'largest', 'second largest', 'third largest'][k]} number in nums "
            f"(counting repeats), or None if nums has fewer than {k} numbers"
        ),
        lambda k: f"return sorted(nums, reverse=True)[{k - 1}] if len(nums) >= {k} else None",
        lambda rng: (_ints(rng, n=(0, 6)),),
    ),
)
N_TASKS = sum(len(f.params) for f in FAMILIES)
"""How many distinct tasks the families give."""


@dataclass(frozen=True, slots=True)
class CodeTask:
    """One function to write."""

    task_id: str
    """``family:params``; its hash decides the split."""
    fn: str
    """The function's name."""
    statement: str
    """``Write a Python function f(x) that ...``."""
    reference: str
    """A correct solution (source)."""
    visible: tuple[tuple[Args, Any], ...]
    """Examples shown to the model: (arguments, expected)."""
    hidden: tuple[tuple[Args, Any], ...]
    """Tests that grade the answer: (arguments, expected). Never shown to the model or its sandbox."""


def split_of(task_id: str) -> str:
    """``test`` for about one task id in five (by hash), else ``train``."""
    return "test" if hashlib.sha256(task_id.encode()).digest()[0] % 5 == 0 else "train"


def task_ids(split: str | None = None) -> list[tuple[Family, tuple[Any, ...]]]:
    """Every (family, params) of ``split`` (``None``: both), in a fixed order."""
    return [
        (f, p)
        for f in FAMILIES
        for p in f.params
        if split is None or split_of(f"{f.name}:{','.join(map(str, p))}") == split
    ]


def check_split(split: str) -> None:
    """Raise :class:`ConfigError` for an unknown split."""
    if split not in ("train", "test"):
        raise ConfigError(f"split must be 'train' or 'test', got {split!r}")


def _solve(fam: Family, params: Sequence[Any]) -> tuple[str, Callable[..., Any]]:
    source = f"def {fam.name}({fam.signature}):\n    {fam.solution(*params)}\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<reference {fam.name}>", "exec"), namespace)  # our own code, not the model's
    fn: Callable[..., Any] = namespace[fam.name]
    return source, fn


def sample(rng: random.Random, split: str = "train", *, n_visible: int = 3, n_hidden: int = 8) -> CodeTask:
    """A task of ``split`` with ``n_visible`` examples and ``n_hidden`` distinct hidden tests."""
    check_split(split)
    pool = task_ids(split)
    fam = rng.choice(sorted({f.name: f for f, _ in pool}.values(), key=lambda f: f.name))  # family first
    params = rng.choice([p for f, p in pool if f is fam])
    source, fn = _solve(fam, params)
    cases: dict[str, tuple[Args, Any]] = {}
    for _ in range(50 * (n_visible + n_hidden)):
        if len(cases) == n_visible + n_hidden:
            break
        args = fam.draw(rng)
        cases.setdefault(repr(args), (args, fn(*args)))
    tests = list(cases.values())
    return CodeTask(
        task_id=f"{fam.name}:{','.join(map(str, params))}",
        fn=fam.name,
        statement=f"Write a Python function {fam.name}({fam.signature}) that {fam.statement(*params)}.",
        reference=source,
        visible=tuple(tests[:n_visible]),
        hidden=tuple(tests[n_visible:]),
    )
