"""The OTB reproduction's quick mode runs end to end and writes well-formed, finite results.

It checks the plumbing (every stage ran, every number is finite, the last line has the agreed form), not
who wins: at quick-mode sizes the numbers are noise.
"""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "otb_reproduction" / "run.py"
LAST_LINE = re.compile(
    r"^variance OTB/GRPO at N=4: (\d+\.\d\d); tokens-to-target OTB N=4 vs GRPO N=32: (\d+\.\d\d)$"
)


@pytest.mark.experiment
@pytest.mark.timeout(1500)
def test_quick_mode_runs_and_writes_finite_results(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--work", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [x for x in proc.stdout.splitlines() if x.strip()]
    m = LAST_LINE.match(lines[-1])
    assert m, f"last line has the wrong form: {lines[-1]!r}"
    assert all(math.isfinite(float(g)) and float(g) > 0 for g in m.groups())

    report = tmp_path / "report"
    rl = json.loads((report / "rl.json").read_text())
    var = json.loads((report / "variance.json").read_text())
    main = rl["main"]["configs"]
    assert {"otb-N4", "grpo-N4", "grpo-N32"} <= set(main)
    for cell in main.values():
        for key in ("initial_success", "final_success"):
            assert 0.0 <= cell[key][0] <= 1.0
        assert cell["tokens_to_target"]["0.7"]["mean"][0] > 0
    assert {"tiny-k4-full", "tiny-k4-tail"} <= set(var)
    for name, summ in var.items():
        table = summ["table"]["4"]
        assert table["otb"]["total_var"][0] > 0, name
        assert table["grpo"]["total_var_ratio"][0] == pytest.approx(1.0)
        # The identity GRPO = (N-1)/N · RLOO holds draw by draw, so the variance ratio is exact.
        assert table["rloo"]["total_var_ratio"][0] == pytest.approx((4 / 3) ** 2, rel=1e-6)
        assert -1.0 <= summ["proxy"]["all"]["spearman"][0] <= 1.0
    # Total variance is defined on every pool. The projection moments need a pool that splits into two
    # halves with successes and failures each (cross-fitting), which a quick pool of 16 trajectories may
    # not have: they are NaN then, but for every estimator alike (the split ignores the estimator).
    for name, summ in var.items():
        for n, row in summ["table"].items():
            for est, cell in row.items():
                for metric in ("total_var", "total_var_ratio"):
                    assert math.isfinite(cell[metric][0]), (name, n, est, metric)
            for metric in ("proj_mean", "proj_var", "snr"):
                defined = {math.isfinite(cell[metric][0]) for cell in row.values()}
                assert len(defined) == 1, (name, n, metric)
    for png in ("rl-main.png", "variance-ratios.png", "proxy-vs-true.png"):
        assert (report / "figures" / png).stat().st_size > 10_000
