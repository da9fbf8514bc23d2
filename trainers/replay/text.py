"""The text ``agentrl replay`` prints for its recompute and step-reproduction reports."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentrl import replay

if TYPE_CHECKING:  # reproduce imports torch; agentrl replay's parser (every command's) imports this module
    from agentrl.trainers.replay.reproduce import StepReport

__all__ = ["print_recompute", "print_step"]


def print_recompute(rep: replay.RecomputeReport) -> None:
    """Print ``replay --recompute``'s report: the training-inference mismatch and its largest tokens."""
    print(
        f"recomputed {rep.tokens} sampled tokens of {len(rep.trajectories)} trajectories "
        f"(temperature {rep.temperature:g}): max |Δ log-prob| {rep.max_abs_diff:.3g}, "
        f"mean {rep.mean_abs_diff:.3g}, mean Σπ² {rep.mean_sum_pi_squared:.3g}"
    )
    if rep.largest:
        print("largest differences (recorded sampler log-prob vs recomputed):")
        print(
            f"  {'traj':>5} {'token':>6} {'id':>6}  {'text':16} {'recorded':>10} {'recomputed':>10} "
            f"{'|Δ|':>9} {'Σπ²':>8}"
        )
        for d in rep.largest:
            text = repr(d.text)[1:-1][:16]
            print(
                f"  {'-' if d.index is None else d.index:>5} {d.token_index:>6} {d.token_id:>6}  {text:16} "
                f"{d.recorded:>10.4f} {d.recomputed:>10.4f} {d.abs_diff:>9.3g} {d.sum_pi_squared:>8.3g}"
            )
    weights = sorted({t.weights for t in rep.trajectories})
    print("weights: " + "; ".join(weights))


def print_step(rep: StepReport) -> None:
    """Print ``replay --step N``'s report: each recorded metric against its recomputed value."""
    print(
        f"step {rep.step}: recomputed from {len(rep.indices)} trajectories with {rep.weights} "
        f"(estimator {rep.estimator}, {rep.device or '-'})"
    )
    if "copy of" in rep.weights:
        rtol, atol = rep.tolerance
        print(f"  note: half-precision weights, so compared within rtol {rtol:g} / atol {atol:g}")
    print(f"  {'metric':34} {'recorded':>14} {'recomputed':>14} {'|Δ|':>9}")
    for c in rep.checks:
        rec = "-" if c.recorded is None else f"{c.recorded:.8g}"
        diff = "-" if c.abs_diff is None else f"{c.abs_diff:.2g}"
        print(f"  {c.name:34} {rec:>14} {c.recomputed:>14.8g} {diff:>9}  {'ok' if c.match else 'DIFFERENT'}")
    bad = [c.name for c in rep.checks if not c.match]
    if bad:
        print(f"step {rep.step}: {len(bad)} of {len(rep.checks)} metrics NOT reproduced: {', '.join(bad)}")
    else:
        print(f"step {rep.step}: all {len(rep.checks)} recorded metrics reproduced")
