"""The stability report's pieces on hand-built runs: replaying the schedule on recorded lengths, finding the
collapse, and the claim that a run on which the rule never fires is the length-triggered run."""

from dataclasses import replace

import settings as S
import stability_report as SR


def fake_run(lengths, rewards, seed=0):
    steps = [
        {"tokens": 100 * (k + 1), "model_tokens_per_episode": L, "reward": r, "grad_norm": 0.1}
        for k, (L, r) in enumerate(zip(lengths, rewards, strict=True))
    ]
    end = {"tokens": 100 * len(steps), "step": len(steps), "success": 0.0}
    curve = [{"tokens": 0, "step": 0, "success": 0.2}, end]
    return {"seed": seed, "steps": steps, "curve": curve, "setting": {"token_budget": 100 * len(steps)}}


def test_first_decay_replays_the_trainers_rule():
    st = replace(S.STRESS_LT, lr_window=3, lr_trigger=1.3)
    flat = fake_run([48.0] * 30, [0.5] * 30)
    assert SR.first_decay(flat, st) is None
    surge = fake_run([40.0] * 6 + [60.0] * 24, [0.5] * 30)
    assert SR.first_decay(surge, st) == 7  # (40 + 60 + 60) / 120 = 1.33 at step 7 (tests/learner)
    shrink = fake_run([48.0] * 10 + [20.0] * 20, [0.5] * 30)
    assert SR.first_decay(shrink, st) is None


def test_collapse_step_is_the_start_of_the_first_all_zero_window():
    rewards = [0.3] * 12 + [0.0] * 3 + [0.1] + [0.0] * 14
    run = fake_run([48.0] * 30, rewards)
    assert SR.collapse_step(run) == 16  # steps 16..25 are the first 10 in a row with reward 0
    assert SR.collapse_step(fake_run([48.0] * 30, [0.0] * 30)) is None  # never had any reward


def test_a_constant_run_stands_in_only_when_the_rule_never_fires():
    flat = fake_run([48.0] * 30, [0.5] * 30, seed=1)
    surge = fake_run([40.0] * 6 + [60.0] * 24, [0.5] * 30, seed=2)
    st = replace(S.STRESS_LT, lr_window=3, lr_trigger=1.3)
    rows, missing = SR.arm([flat, surge], [], st)
    assert [r["seed"] for r in rows] == [1] and missing == [2]
    assert rows[0]["source"].startswith("constant run")
