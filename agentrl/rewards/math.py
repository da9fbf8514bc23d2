r"""Math answers graded by Hugging Face's ``math-verify``: :func:`grade_math` is the one function.

``math-verify`` parses LaTeX (``\frac``, ``\dfrac``, ``\boxed{}``, ``\text{}``, powers), plain numbers and
expressions, sets, intervals, percentages and equations (``x = 5``), and compares them symbolically and
numerically (to 6 decimal places). Every failure of it is a zero score with a recorded reason, never an
exception: an answer it cannot parse (``no parsable answer``), a comparison that raised, or one that ran past
the time limit (``timed out``).

Timeouts. ``math-verify``'s own timeout is ``signal.alarm``, which only works in the main thread and cancels
any alarm set around it (pytest-timeout's, for one). So its timeouts are turned off and this module keeps
its own: in the main thread an interval timer that raises out of the comparison and then restores whatever
timer and handler were there before; in any other thread (the trainer runs episodes on
:func:`agentrl._sync.run_sync`'s loop thread, Ray actors on theirs) the grading runs in a worker process
whose main thread does the same, and a worker that does not answer in time is killed and replaced. Grading
a short answer takes about a millisecond; the limit only bounds pathological input (``10^{10^{10}}``).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

from agentrl.errors import ConfigError

from .grade import Grade

__all__ = ["DEFAULT_TIMEOUT_S", "Gold", "grade_math", "serve"]

Gold = int | Fraction | str
"""A reference answer: an exact number, or text (LaTeX or plain) that math-verify parses."""

DEFAULT_TIMEOUT_S = 5.0
"""Seconds one grading (parse and compare) may take before it scores 0 as ``timed out``."""

_WORKER_START_S = 60.0
"""Extra seconds a worker process gets on its first call (it imports sympy) before it is given up on."""


@functools.cache
def _lib() -> Any:
    """The ``math_verify`` package, imported on the first grading, not with this module: it pulls in sympy
    (~0.8 CPU-seconds), which every process that imports the trainer's config (each Ray actor, each CLI
    run) would pay whether or not it grades math."""
    import math_verify.grader
    import math_verify.parser

    # Our own timer replaces math-verify's signal.alarm (module docstring); with timeouts off it would log
    # a one-time warning that the caller must bound the time itself, which is what this module does.
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    return math_verify


def _is_expr(t: object) -> bool:
    import sympy

    return isinstance(t, sympy.Basic | sympy.MatrixBase)


class _TimedOut(BaseException):
    """Raised out of math-verify by our timer; a BaseException so its ``except Exception`` passes it on."""


def grade_math(answer: str | None, gold: Gold, *, timeout: float = DEFAULT_TIMEOUT_S) -> Grade:
    r"""Grade a final answer against the reference with math-verify.

    Args:
        answer: The model's final answer (``17273``, ``\frac{1}{2}``, ``x = 5``, ``\boxed{7}``), or a text
            that ends in one (math-verify takes the last ``\boxed{}``, ``$...$`` or number).
        gold: The reference: an ``int`` or :class:`~fractions.Fraction` (compared exactly as that number),
            or a string math-verify parses (``"\\frac{1}{2}"``, ``"[1, 2)"``, ``"\\{1, 2\\}"``).
        timeout: Seconds before the grading gives up with a zero score (``timed out``).

    Returns:
        ``Grade(1.0, "equal")`` or ``Grade(0.0, reason)``; never raises for anything in ``answer``.

    Raises:
        ConfigError: ``gold`` is not an int, Fraction or non-empty string math-verify can parse, or
            ``timeout`` is not positive.
    """
    if isinstance(gold, bool) or not isinstance(gold, int | Fraction | str) or gold == "":
        raise ConfigError(f"gold must be an int, a Fraction or a non-empty string, got {gold!r}")
    if not timeout > 0:
        raise ConfigError(f"timeout must be positive, got {timeout!r}")
    if answer is None or not str(answer).strip():
        return Grade(0.0, "no answer")
    if threading.current_thread() is threading.main_thread():
        score, reason = _grade_here(str(answer), gold, timeout)
    else:
        score, reason = _grade_in_worker(str(answer), gold, timeout)
    return Grade(score, reason)


def _grade_here(answer: str, gold: Gold, timeout: float) -> tuple[float, str]:
    """Grade in this (the main) thread under our interval timer."""
    _lib()  # the first import (seconds on a busy machine) is not the answer's time
    try:
        with _time_limit(timeout):
            target = _parse_answer(answer)
            if not any(_is_expr(t) for t in target):
                return 0.0, f"no parsable answer in {answer[:80]!r}"
            ok = _lib().verify(_gold_exprs(gold), target, timeout_seconds=None, raise_on_error=True)
    except _TimedOut:
        return 0.0, f"timed out after {timeout:g} s"
    except ConfigError:  # the gold itself is unreadable: the task is broken, not the answer
        raise
    except Exception as e:  # math-verify and sympy raise anything on odd input: a score of 0, with why
        return 0.0, f"math-verify failed: {type(e).__name__}: {str(e)[:200]}"
    return (1.0, "equal") if ok else (0.0, f"not equal: {_shown(target)} vs {gold}")


def _parse_answer(answer: str) -> list[Any]:
    r"""math-verify's parse of the answer read as LaTeX (inside ``\boxed{}``: ``\dfrac``, ``2^{10}``,
    ``\text{17}`` and a unicode minus parse there and not bare), else of the plain text (``17273.``)."""
    parse = _lib().parse
    boxed = parse(f"\\boxed{{{answer}}}", parsing_timeout=None, raise_on_error=True)
    if any(_is_expr(t) for t in boxed):
        return list(boxed)
    return list(parse(answer, parsing_timeout=None, raise_on_error=True))


def _gold_exprs(gold: Gold) -> list[Any]:
    """The reference as math-verify's gold list (numbers exactly, text parsed like an answer)."""
    import sympy

    if isinstance(gold, int):
        return [sympy.Integer(gold)]
    if isinstance(gold, Fraction):
        return [sympy.Rational(gold.numerator, gold.denominator)]
    exprs = _parse_answer(gold)
    if not exprs:
        raise ConfigError(f"math-verify cannot parse the gold answer {gold!r}")
    return exprs


def _shown(target: list[Any]) -> str:
    return str(target[-1])[:80] if target else "nothing"


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`_TimedOut` after ``seconds`` (main thread only); restore the previous timer and handler
    afterwards, with the time the outer timer had left less what this block used."""

    def fire(signum: int, frame: object) -> None:
        raise _TimedOut

    old_handler = signal.signal(signal.SIGALRM, fire)
    outer_left, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if outer_left > 0:  # an outer alarm was pending: give it back what is left of it
            used = seconds - left
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - used, 1e-3), outer_interval)


_worker_lock = threading.Lock()
_worker: subprocess.Popen[str] | None = None
_worker_started = False


def _grade_in_worker(answer: str, gold: Gold, timeout: float) -> tuple[float, str]:
    """Grade in the worker process (``python -m agentrl.rewards._math_worker``, whose main thread runs
    :func:`_grade_here`): off the main thread no timer can interrupt this thread, but a process can be
    killed. A plain subprocess (not multiprocessing's spawn) so the caller's ``__main__`` is never
    re-imported."""
    global _worker, _worker_started
    with _worker_lock:
        if _worker is None or _worker.poll() is not None:
            _worker = subprocess.Popen(
                [sys.executable, "-m", "agentrl.rewards._math_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            _worker_started = False
        worker = _worker
        assert worker.stdin is not None and worker.stdout is not None
        wait = timeout + 5.0 + (0.0 if _worker_started else _WORKER_START_S)
        gold_wire = [gold.numerator, gold.denominator] if isinstance(gold, Fraction) else gold
        try:
            worker.stdin.write(json.dumps({"answer": answer, "gold": gold_wire, "timeout": timeout}) + "\n")
            worker.stdin.flush()
            ready, _, _ = select.select([worker.stdout], [], [], wait)
            line = worker.stdout.readline() if ready else None
        except OSError as e:
            _kill_worker()
            raise RuntimeError(f"the math grading process failed: {e}") from e
        if line is None:
            _kill_worker()
            return 0.0, f"timed out after {timeout:g} s (the grading process was killed)"
        if not line:  # it died under us (killed, out of memory): the machinery failed, not the answer
            code = worker.wait()
            _kill_worker()
            raise RuntimeError(f"the math grading process exited with {code} while grading")
        _worker_started = True
        reply = json.loads(line)
        if "config_error" in reply:
            raise ConfigError(str(reply["config_error"]))
        return float(reply["score"]), str(reply["reason"])


@atexit.register
def _kill_worker() -> None:
    global _worker
    proc, _worker = _worker, None
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def serve() -> None:
    """The worker process's loop: one JSON request per stdin line, one JSON reply per stdout line."""
    _lib()  # while the first request is on its way
    for line in sys.stdin:
        req = json.loads(line)
        gold = req["gold"]
        gold = Fraction(gold[0], gold[1]) if isinstance(gold, list) else gold
        try:
            score, reason = _grade_here(str(req["answer"]), gold, float(req["timeout"]))
            reply: dict[str, object] = {"score": score, "reason": reason}
        except ConfigError as e:
            reply = {"config_error": str(e)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
