"""Run a candidate function on test inputs inside a sandbox; compare its outputs with the expected ones here.

The grading design, and why each reward hack fails:

- **Expected outputs never enter a sandbox.** Only the candidate's code and the test *inputs* go in; the
  candidate's outputs come back as JSON and are compared on the host (:func:`compare`). Reading every file,
  process and frame in the sandbox finds no expected output, and no reported line, fake or real, scores
  unless its values are right.
- **The candidate runs in a child process per test** (``python -I -S``, a fresh temporary directory, its
  stdout in a file, not a pipe). The driver, a separate process, is the only one that prints to the run's
  stdout. Monkeypatching builtins, ``assert``, ``print``, ``json`` or the reporter inside the child changes
  only the child's own answer; ``sys.exit``/``os._exit`` before the result is written leaves that test
  without a result (failed); files written are in the child's own temporary directory, and nothing the
  driver or the host reads comes from files.
- **Outputs are plain data.** The child serializes a result only if it is made of exact ``int``, ``float``,
  ``str``, ``bool``, ``None``, lists, tuples and dicts with string keys; an object whose ``__eq__`` is always
  true cannot be reported, and the comparison is type-exact.
- **Timeouts live outside the candidate.** The driver waits for each child with a deadline and kills its
  whole process group; a total budget bounds the run, and the sandbox's own wall limit backs it up.
- **The driver's report carries a nonce** chosen on the host for this run; a stdout with no report or more
  than one is the candidate's doing (it killed or impersonated the driver) and scores 0.

A sandbox failure (status ``sandbox_error``) is infrastructure: :meth:`agentrl.ScoreContext.run_fresh` and
the ``run_tests`` tool raise :class:`~agentrl.errors.SandboxError` for it, so the episode is dropped, never
scored 0.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl import ExecResult, ToolStatus

__all__ = ["TestOutcome", "compare", "driver_code", "parse_report"]

_CHILD = r"""
import builtins as _b, json as _j, os as _o, sys as _s
_w, _x, _d, _type, _builtins = _o.write, _o._exit, _j.dumps, type, dict(_b.__dict__)
_req = _j.loads(_s.stdin.read())
_n = {"__name__": "__candidate__"}


def _plain(v, depth=0):
    if depth > 50:
        raise TypeError("nested too deeply")
    t = _type(v)
    if v is None or t is bool or t is int or t is str:
        return v
    if t is float:
        return v if v == v and v not in (float("inf"), float("-inf")) else repr(v)
    if t is list or t is tuple:
        return [_plain(x, depth + 1) for x in v]
    if t is dict and all(_type(k) is str for k in v):
        return {k: _plain(x, depth + 1) for k, x in v.items()}
    raise TypeError(f"returned a {t.__name__}, which is not plain data")


try:
    exec(compile(_req["code"], "<answer>", "exec"), _n)
    _f = _n.get(_req["fn"])
    if not callable(_f):
        raise NameError(f"the answer defines no function {_req['fn']!r}")
    _out = {"status": "ok", "value": _plain(_f(*_req["args"]))}
except BaseException as _e:
    _out = {"status": "error", "error": f"{_type(_e).__name__}: {_e}"[:300]}
_b.__dict__.clear()  # an answer that patched builtins broke only its own value, not the report
_b.__dict__.update(_builtins)
try:
    _line = _d(_out)
except BaseException:
    _line = _d({"status": "error", "error": "the result is not plain data"})
_s.stdout.flush()
_w(1, ("\n\x1eRESULT " + _line + "\n").encode())
_x(0)
"""

_DRIVER = r"""
def _agentrl_grade():
    import json, os, signal, subprocess, sys, tempfile, time

    code, fn, inputs = {code!r}, {fn!r}, json.loads({inputs!r})
    child, per_test, budget, nonce = {child!r}, {per_test!r}, {budget!r}, {nonce!r}
    out, start = [], time.monotonic()
    for args in inputs:
        if time.monotonic() - start > budget:
            out.append({{"status": "skipped", "error": "time budget of the run used up"}})
            continue
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "in"), "w") as f:
                f.write(json.dumps({{"code": code, "fn": fn, "args": args}}))
            with open(os.path.join(d, "in")) as fin, open(os.path.join(d, "out"), "w+b") as fout:
                p = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", child], stdin=fin, stdout=fout,
                    stderr=subprocess.DEVNULL, cwd=d, start_new_session=True,
                )
                try:
                    p.wait(timeout=per_test)
                    timed_out = False
                except subprocess.TimeoutExpired:
                    timed_out = True
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait()
                fout.seek(0)
                text = fout.read(1 << 16).decode("utf-8", "replace")
        if timed_out:
            out.append({{"status": "timeout", "error": f"no result within {{per_test}} s"}})
            continue
        lines = [l for l in text.split("\n") if l.startswith("\x1eRESULT ")]
        try:
            out.append(json.loads(lines[-1][len("\x1eRESULT "):]))
        except (IndexError, ValueError):
            out.append({{"status": "crashed", "error": f"exited with code {{p.returncode}} before a result"}})
    print("\n" + nonce + " " + json.dumps(out))


_agentrl_grade()
del _agentrl_grade
"""


def driver_code(
    code: str,
    fn: str,
    inputs: Sequence[Sequence[Any]],
    *,
    per_test_s: float = 1.0,
    budget_s: float = 5.0,
) -> tuple[str, str]:
    """The code to run in a sandbox to call ``fn`` of ``code`` on each argument list of ``inputs``, and the
    nonce its report line starts with (read it back with :func:`parse_report`)."""
    nonce = "AGENTRL-GRADE-" + secrets.token_hex(16)
    src = _DRIVER.format(
        code=code,
        fn=fn,
        inputs=json.dumps([list(a) for a in inputs]),
        child=_CHILD,
        per_test=float(per_test_s),
        budget=float(budget_s),
        nonce=nonce,
    )
    return src, nonce


@dataclass(frozen=True, slots=True)
class TestOutcome:
    """One test of a graded answer."""

    passed: bool
    """The answer returned the expected value."""
    status: str
    """``ok`` (returned a value), ``error`` (raised, or returned something that is not plain data),
    ``timeout``, ``crashed`` (exited before reporting), ``skipped`` (time budget), ``no_report`` (the
    run produced no single report: the driver was killed or impersonated)."""
    got: Any = None
    """The value returned (``ok`` only)."""
    error: str = ""
    """What went wrong, for the model or the log."""


def parse_report(result: ExecResult, nonce: str, n_tests: int) -> list[dict[str, Any]] | str:
    """The driver's per-test records, or why there are none (a string). The caller raises for
    ``sandbox_error`` before calling this; every other failure here is the candidate's doing."""
    lines = [line for line in result.stdout.split("\n") if line.startswith(nonce + " ")]
    if result.status is not ToolStatus.OK or len(lines) != 1:
        why = result.message or result.stderr.strip()[-200:] or f"{len(lines)} reports"
        return f"the grading run ended with status {result.status.value} ({why})"
    try:
        records = json.loads(lines[0][len(nonce) + 1 :])
    except ValueError:
        return "the grading report is not JSON"
    if (
        not isinstance(records, list)
        or len(records) != n_tests
        or not all(isinstance(r, dict) for r in records)
    ):
        return "the grading report does not have one record per test"
    return records


def same(got: Any, want: Any) -> bool:
    """Type-exact equality of plain data (tuples as lists; floats to a relative 1e-9)."""
    if isinstance(want, tuple):
        want = list(want)
    if type(got) is not type(want):
        return type(want) is float and type(got) is int and math.isclose(got, want, rel_tol=1e-9)
    if isinstance(want, float):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(want, list):
        return len(got) == len(want) and all(same(a, b) for a, b in zip(got, want, strict=True))
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return bool(got == want)


def compare(records: list[dict[str, Any]] | str, expected: Sequence[Any]) -> list[TestOutcome]:
    """Each test's outcome: the driver's record against the expected value (which stayed on the host)."""
    if isinstance(records, str):
        return [TestOutcome(False, "no_report", error=records) for _ in expected]
    out = []
    for rec, want in zip(records, expected, strict=True):
        status = str(rec.get("status", "error"))
        if status == "ok":
            got = rec.get("value")
            out.append(TestOutcome(same(got, want), "ok", got))
        else:
            out.append(TestOutcome(False, status, error=str(rec.get("error", ""))[:300]))
    return out
