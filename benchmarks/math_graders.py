r"""Compare the math graders: math-verify (``agentrl.rewards.grade_math``) against the hand-written exact
number reader (``agentrl.tools.parse_number``), on the answers our math envs produce and on math-verify's
own regression cases.

Three answer sets:

* ``env``: every problem kind and difficulty of ``math-tir-v0`` (``envs/math_problems.py``, seeds 0..N-1),
  each gold answer written the ways a model writes it (plain, thousands commas, ``\boxed{}``, ``$..$``,
  a trailing period, ``x = N``, ``N apples``, a unicode minus, ``\frac``/``\dfrac``/``a/b``, an unreduced
  fraction, Python's float repr (``print(a / b)``), decimals to 6 and 2 places, ``N.0``) plus a wrong
  answer (gold + 1). The expected verdict is what a human grader would say (a rounded decimal of a
  non-terminating fraction is wrong).
* ``trajectories``: the final answers of recorded ``math-tir`` trajectories, if a run folder is given
  (``--runs DIR ...``; the repository ships none).
* ``mv``: math-verify's own ``(gold, pred, expected)`` cases, read (as literals, with ``ast``) from the test
  files of a Math-Verify checkout (``--mv-tests DIR``); they are not shipped in its wheel.

Each answer goes through the env's extraction (``agentrl.tools.extract_answer``: the last ``\boxed{}`` or
``Answer:`` line, code blocks ignored) and then through both graders. The old grader can only read numbers;
where the gold is not a number it grades by exact text, as ``ToolEnv.score`` did.

    python benchmarks/math_graders.py --seeds 40 [--mv-tests PATH] [--runs RUN ...] [--show 20]
"""

from __future__ import annotations

import argparse
import ast
import json
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path

from agentrl.envs import math_problems
from agentrl.rewards import grade_math
from agentrl.tools import extract_answer, parse_number

Case = tuple[str, str, str | int | Fraction, bool]  # (set, model text, gold, expected)


def _variants(gold: int | Fraction) -> list[tuple[str, bool]]:
    if isinstance(gold, Fraction) and gold.denominator == 1:
        gold = int(gold)
    if isinstance(gold, int):
        n = gold
        out = [
            (f"Answer: {n}", True),
            (f"Answer: {n:,}", True),
            (f"\\boxed{{{n}}}", True),
            (f"Answer: ${n}$", True),
            (f"Answer: {n}.", True),
            (f"Answer: x = {n}", True),
            (f"Answer: {n} apples", True),
            (f"Answer: {n}.0", True),
            (f"Answer: {n + 1}", False),
        ]
        if n < 0:
            out.append((f"Answer: \u2212{-n}", True))
        return out
    a, b = gold.numerator, gold.denominator
    six, two = f"{float(gold):.6f}", f"{float(gold):.2f}"
    terminating = Fraction(two) == gold
    return [
        (f"Answer: {a}/{b}", True),
        (f"\\boxed{{\\frac{{{a}}}{{{b}}}}}", True),
        (f"Answer: $\\dfrac{{{a}}}{{{b}}}$", True),
        (f"Answer: {2 * a}/{2 * b}", True),
        (f"Answer: {float(gold)!r}", True),  # what print(a / b) shows in the python tool
        (f"Answer: {six}", Fraction(six) == gold),
        (f"Answer: {two}", terminating),
        (f"Answer: {a + b}/{b}", False),
    ]


def env_cases(seeds: int) -> list[Case]:
    """Gold answers of math-tir-v0's problems with their written variants."""
    import random

    cases: list[Case] = []
    for kind in math_problems.KINDS:
        for difficulty in (1, 2, 3):
            for seed in range(seeds):
                p = math_problems.sample(
                    random.Random(seed), split="train", kinds=(kind,), difficulty=difficulty
                )
                cases += [("env", text, p.answer, ok) for text, ok in _variants(p.answer)]
    return cases


def trajectory_cases(runs: list[Path]) -> list[Case]:
    """Final answers of recorded math-tir trajectories, expected as their recorded reward said."""
    cases: list[Case] = []
    for run in runs:
        for line in (run / "trajectories.jsonl").read_text().splitlines():
            d = json.loads(line)
            if not str(d.get("meta", {}).get("env_id", "")).startswith("math-tir") or not d.get("actions"):
                continue
            gold = parse_number(str(d.get("meta", {}).get("extra", {}).get("answer", "")))
            if gold is not None:
                cases.append(("trajectories", d["actions"][-1], gold, d["reward"] >= 1.0))
    return cases


def mv_cases(folder: Path) -> list[Case]:
    """math-verify's own (gold, pred, expected) literals from its test files."""
    cases: list[Case] = []
    for path in sorted(folder.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple) and len(node.elts) == 3:
                try:
                    gold, pred, expected = (ast.literal_eval(e) for e in node.elts)
                except ValueError:
                    continue
                if isinstance(gold, str) and isinstance(pred, str) and expected in (0, 1, True, False):
                    cases.append(("mv", pred, gold, bool(expected)))
    return cases


def old_grade(text: str, gold: str | int | Fraction) -> bool:
    """tools/answers.py as the envs used it: an exact number, else exact text."""
    answer = extract_answer(text)
    want = gold if not isinstance(gold, str) else parse_number(gold)
    if want is None:
        return answer is not None and answer.strip() == str(gold).strip()
    value = parse_number(answer)
    return value is not None and value == want


def new_grade(text: str, gold: str | int | Fraction) -> tuple[bool, str]:
    """grade_math on the env's extracted answer (the whole text when nothing was extracted)."""
    answer = extract_answer(text)
    try:
        g = grade_math(answer if answer is not None else text, gold, timeout=5.0)
    except ValueError as e:  # a gold math-verify cannot parse
        return False, f"gold unparsable: {e}"
    return g.score == 1.0, g.reason


def main() -> None:
    """Run the comparison and print a summary (and ``--json`` rows)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--mv-tests", type=Path)
    ap.add_argument("--runs", type=Path, nargs="*", default=[])
    ap.add_argument("--show", type=int, default=15, help="disagreements to print per set")
    ap.add_argument("--json", type=Path, help="write every case with both verdicts here")
    args = ap.parse_args()
    cases = env_cases(args.seeds) + trajectory_cases(args.runs)
    if args.mv_tests:
        cases += mv_cases(args.mv_tests)
    rows = []
    t_old = t_new = 0.0
    for kind, text, gold, expected in cases:
        t0 = time.perf_counter()
        old = old_grade(text, gold)
        t1 = time.perf_counter()
        new, reason = new_grade(text, gold)
        t_new += time.perf_counter() - t1
        t_old += t1 - t0
        rows.append(
            {
                "set": kind,
                "text": text,
                "gold": str(gold),
                "expected": expected,
                "old": old,
                "new": new,
                "reason": reason,
            }
        )
    for kind in dict.fromkeys(r["set"] for r in rows):
        sub = [r for r in rows if r["set"] == kind]
        c = Counter((r["old"] == r["expected"], r["new"] == r["expected"]) for r in sub)
        print(
            f"{kind}: {len(sub)} cases; old right {sum(r['old'] == r['expected'] for r in sub)}, "
            f"math-verify right {sum(r['new'] == r['expected'] for r in sub)}; both right {c[True, True]}, "
            f"only old {c[True, False]}, only math-verify {c[False, True]}, both wrong {c[False, False]}"
        )
        shown = 0
        for r in sub:
            if r["old"] != r["new"] and shown < args.show:
                shown += 1
                print(
                    f"   old={int(r['old'])} mv={int(r['new'])} expected={int(r['expected'])} "
                    f"gold={r['gold'][:40]!r} text={r['text'][:70]!r} ({r['reason'][:60]})"
                )
    print(
        f"time: old {t_old * 1e3 / len(rows):.3f} ms/case, math-verify {t_new * 1e3 / len(rows):.3f} ms/case"
    )
    if args.json:
        args.json.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


if __name__ == "__main__":
    main()
