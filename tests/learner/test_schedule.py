"""The length-triggered learning-rate schedule and the collapse detector on hand-built metric sequences."""

import json
import math

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.learner import LearnerConfig
from agentrl.learner.schedule import ScheduleState, length_ratio, observe_length
from agentrl.learner.stability import (
    CollapseState,
    StabilityState,
    StepInputs,
    begin_step,
    check_collapse,
    observe_step,
)


def run_schedule(lengths, state=None, **kw):
    """Feed ``lengths`` one step at a time; return (lrs, signals, triggered steps, final state)."""
    state = state or ScheduleState()
    lrs, signals, fired = [], [], []
    for k, length in enumerate(lengths):
        out = observe_length(state, length, base_lr=1.0, step=k, **kw)
        state = out.state
        lrs.append(out.lr)
        signals.append(out.signal)
        if out.triggered:
            fired.append(k)
    return lrs, signals, fired, state


def test_length_ratio_by_hand():
    assert math.isnan(length_ratio([10, 10, 10], window=2))  # fewer than 2·window lengths
    # last 2: (30 + 50) / 2 = 40; the 2 before: (10 + 30) / 2 = 20
    assert length_ratio([1, 10, 30, 30, 50], window=2) == pytest.approx(2.0)
    assert length_ratio([5, 5, 5, 5], window=2) == 1.0
    with pytest.raises(ConfigError, match="window"):
        length_ratio([1, 2], window=0)


def test_flat_lengths_never_trigger():
    lrs, signals, fired, state = run_schedule([48.0] * 50, window=5, trigger=1.3)
    assert fired == [] and lrs == [1.0] * 50 and state.decays == 0
    assert all(math.isnan(s) for s in signals[:9]) and signals[9:] == [1.0] * 41


def test_a_surge_decays_once_then_needs_a_new_surge():
    """window 3: steps 0-5 at 40 tokens, then 60 (a 1.5x surge). At step 6 the ratio is 140/120 = 1.17;
    at step 7 the last three are 40, 60, 60: (160/3) / 40 = 1.33 >= 1.3, so step 7 trains at half the
    rate and the history restarts. The plateau at 60 after that never reaches the trigger again; a second
    surge to 90 (from step 20) does."""
    lengths = [40.0] * 6 + [60.0] * 14 + [90.0] * 10
    lrs, signals, fired, state = run_schedule(lengths, window=3, trigger=1.3, decay=0.5, floor=0.1)
    assert fired[0] == 7
    assert signals[6] == pytest.approx(140 / 120) and signals[7] == pytest.approx(160 / 120)
    assert lrs[:7] == [1.0] * 7 and lrs[7:20] == [0.5] * 13
    assert math.isnan(signals[8])  # history cleared: 2·window new steps before the next decision
    # the second surge: window means (60, 60, 90) / (60, 60, 60) = 1.17 (step 20), then 1.33 at step 21
    assert fired == [7, 21] and lrs[21:] == [0.25] * 9
    assert state.decays == 2 and state.last_decay_step == 21


def test_the_floor_bounds_the_rate():
    # A length that doubles every 2 steps (window 1) triggers every time the history allows.
    lengths = [2.0**k for k in range(30)]
    lrs, _, fired, state = run_schedule(lengths, window=1, trigger=1.5, decay=0.5, floor=0.2)
    assert min(lrs) == pytest.approx(0.2) and lrs[-1] == pytest.approx(0.2)
    # 1 → .5 → .25 → .2 (floored) then no more decays (already at the floor)
    assert state.decays == 3 and len(fired) == 3


def test_a_shrinking_length_does_not_trigger():
    """The paper's warning is a surge in length; shorter episodes never decay the rate."""
    lengths = [48.0] * 10 + [20.0] * 10 + [8.0] * 10
    _, _, fired, _ = run_schedule(lengths, window=3, trigger=1.3)
    assert fired == []


def test_constant_schedule_reports_the_signal_but_never_decays():
    lengths = [40.0] * 6 + [80.0] * 6
    lrs, signals, fired, _ = run_schedule(lengths, schedule="constant", window=3, trigger=1.3)
    assert fired == [] and lrs == [1.0] * 12 and max(s for s in signals if s == s) == 2.0


def test_state_round_trip_mid_sequence_changes_nothing():
    """Interrupting after any step and resuming from the JSON state gives the same rates and signals."""
    lengths = [40.0] * 6 + [60.0] * 14 + [90.0] * 10
    kw = {"window": 3, "trigger": 1.3, "decay": 0.5, "floor": 0.1}
    full = run_schedule(lengths, **kw)
    for cut in (1, 7, 8, 15, 21):
        first = run_schedule(lengths[:cut], **kw)
        restored = ScheduleState.from_json(json.loads(json.dumps(first[3].to_json())))
        assert restored == first[3]
        state = restored
        lrs, signals = list(first[0]), list(first[1])
        for k in range(cut, len(lengths)):
            out = observe_length(state, lengths[k], base_lr=1.0, step=k, **kw)
            state = out.state
            lrs.append(out.lr)
            signals.append(out.signal)
        assert lrs == full[0] and [round(s, 12) for s in signals if s == s] == [
            round(s, 12) for s in full[1] if s == s
        ]
        assert state == full[3]


def test_bad_options_are_refused_with_what_was_wrong():
    with pytest.raises(ConfigError, match="lr_schedule"):
        LearnerConfig(lr_schedule="cosine")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="lr_trigger must be a length ratio > 1"):
        LearnerConfig(lr_trigger=0.9)
    with pytest.raises(ConfigError, match="lr_decay"):
        LearnerConfig(lr_decay=1.0)
    with pytest.raises(ConfigError, match="lr_floor"):
        LearnerConfig(lr_floor=0.0)
    with pytest.raises(ConfigError, match="lr_window"):
        LearnerConfig(lr_window=0)
    with pytest.raises(ConfigError, match="schedule state"):
        ScheduleState.from_json({"scale": 1.0})


# --- the collapse detector -------------------------------------------------------------------------------
def run_detector(steps):
    state, flags, fracs = CollapseState(), [], []
    for groups in steps:
        out = check_collapse(state, groups)
        state = out.state
        flags.append(out.collapsed)
        fracs.append(out.zero_variance_frac)
    return flags, fracs, state


def test_collapse_is_flagged_only_after_steps_with_signal():
    mixed = [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]  # one group has signal
    dead = [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    solved = [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]  # all equal within each group: no signal either
    flags, fracs, state = run_detector([dead, dead, mixed, mixed, dead, solved, mixed, dead])
    # never had signal → not a collapse (a task too hard); after signal → flagged; signal again → cleared
    assert flags == [False, False, False, False, True, True, False, True]
    assert fracs == [1.0, 1.0, 0.5, 0.5, 1.0, 1.0, 0.5, 1.0]
    assert state == CollapseState(signal_steps=3, silent_steps=1)


def test_collapse_edge_cases():
    out = check_collapse(CollapseState(signal_steps=2), [])
    assert not out.collapsed and math.isnan(out.zero_variance_frac)  # no groups: nothing to judge
    out = check_collapse(CollapseState(signal_steps=2), [[0.5], [0.25]])  # groups of one: no variance
    assert out.collapsed and out.state.silent_steps == 1
    assert not check_collapse(CollapseState(signal_steps=1), [[0.5, 0.5000001]]).collapsed


class _Traj:
    def __init__(self, n, r):
        self.num_model_tokens, self.reward = n, r


class _Group(list):
    @property
    def rewards(self):
        return tuple(t.reward for t in self)


def test_observe_step_metrics_warning_and_checkpoint_state():
    cfg = LearnerConfig(lr=0.01, lr_schedule="length-triggered", lr_window=1, lr_trigger=1.5)
    groups = [_Group([_Traj(10, 0.0), _Traj(20, 1.0)])]
    first = observe_step(cfg, StabilityState(), StepInputs.of(groups), step=0)
    assert first.metrics["learn/response_length"] == 15.0 and first.metrics["learn/lr"] == 0.01
    assert math.isnan(first.metrics["learn/lr_length_ratio"]) and first.warning(0) is None
    dead = [_Group([_Traj(30, 0.0), _Traj(30, 0.0)])]  # twice as long, and no reward variance
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    second = begin_step(cfg, opt, first.state, dead, step=1)
    m = second.metrics
    assert m["learn/lr_length_ratio"] == 2.0 and m["learn/lr"] == 0.005 and m["learn/lr_decays"] == 1.0
    assert opt.param_groups[0]["lr"] == 0.005  # the optimizer takes the step's rate
    assert m["stability/collapsed"] == 1.0 and m["stability/zero_variance_frac"] == 1.0
    warning = second.warning(1)
    assert warning is not None and "training on nothing" in warning and "after 1 step(s)" in warning
    extra = {"next_step": 2, "stability": second.state.to_json()}
    assert StabilityState.from_extra(json.loads(json.dumps(extra))) == second.state
    assert StabilityState.from_extra({"next_step": 2}) == StabilityState()  # an old checkpoint


def test_constant_schedule_leaves_the_optimizer_alone():
    cfg = LearnerConfig(lr=0.01)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.123)
    out = begin_step(cfg, opt, StabilityState(), [_Group([_Traj(4, 1.0)])], step=0)
    assert opt.param_groups[0]["lr"] == 0.123 and out.metrics["learn/lr"] == 0.01


def test_merged_rank_inputs_decide_like_one_learner():
    a = StepInputs((10, 20), ((0.0, 1.0),))
    b = StepInputs((30, 40), ((1.0, 1.0),))
    merged = StepInputs.merge([a, b])
    assert merged == StepInputs((10, 20, 30, 40), ((0.0, 1.0), (1.0, 1.0)))
    out = observe_step(LearnerConfig(), StabilityState(), merged, step=0)
    assert out.mean_length == 25.0 and out.collapse.zero_variance_frac == 0.5


def test_a_step_where_every_episode_succeeds_is_solved_not_collapsed():
    out = check_collapse(CollapseState(signal_steps=2), [[1.0, 1.0], [1.0, 1.0]])
    assert out.solved and not out.collapsed and out.state.silent_steps == 1
    mixed = check_collapse(CollapseState(signal_steps=2), [[1.0, 1.0], [0.0, 0.0]])
    assert mixed.collapsed and not mixed.solved  # some groups all fail: the collapse warning stands
