"""Dynamic sampling's bookkeeping (agentrl.dynamic_sampling.StepDraws) and refills in admission control: the
refill and cap logic, order independence (rounds and one-by-one completion draw the same groups), the
verdict's tolerance, the config, and Admission.refill keeping the staleness bound and the accounting."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.dynamic_sampling import (
    DynamicSampling,
    GroupVerdict,
    NoDynamicSampling,
    StepDraws,
    zero_variance,
)
from agentrl.errors import ConfigError
from agentrl.staleness import Admission

S, Z, F = GroupVerdict.SIGNAL, GroupVerdict.ZERO_VARIANCE, GroupVerdict.TOO_FEW_USABLE


def _rounds(outcomes: list[GroupVerdict], b: int, k: int) -> StepDraws:
    """The synchronous loop: issue what is needed, finish the whole round, repeat."""
    d = StepDraws.of(b, DynamicSampling(max_draws=k))
    while n := d.need():
        for i in d.issue(n):
            d.record(outcomes[i])
    return d


def _one_by_one(outcomes: list[GroupVerdict], b: int, k: int, rng: random.Random) -> StepDraws:
    """The asynchronous loop: groups finish in any order, a refill is issued as soon as one is needed."""
    d = StepDraws.of(b, DynamicSampling(max_draws=k))
    running = list(d.issue(d.need()))
    while running:
        i = running.pop(rng.randrange(len(running)))
        d.record(outcomes[i])
        running += list(d.issue(d.need()))
    return d


def test_refills_until_the_step_has_its_groups_with_signal():
    # b = 2: draws 0, 1 (Z, S) → one refill (draw 2: Z) → another (draw 3: S) → done, 4 drawn.
    d = _rounds([Z, S, Z, S, S, S, S, S], b=2, k=4)
    assert (d.drawn, d.with_signal, d.filtered, d.capped, d.complete) == (4, 2, 2, False, True)


def test_a_capped_step_trains_on_what_it_has_and_says_so():
    d = _rounds([Z, F, S, Z, Z, Z], b=2, k=3)
    assert (d.drawn, d.with_signal, d.filtered, d.capped, d.complete) == (6, 1, 5, True, True)
    assert d.need() == 0
    with pytest.raises(ConfigError, match="cannot issue"):
        d.issue(1)


def test_the_step_says_what_it_drew_kept_and_filtered():
    # Issue 47: the console said "0 of 2 had reward signal; training on those", then "no update".
    refilled = _rounds([Z, S, Z, S, S, S, S, S], b=2, k=4).report(3)
    assert refilled == (
        "step 3: dynamic sampling drew 4 groups (2 + 2 refill(s)), kept 2 with reward signal, filtered 2 "
        "whose members all got the same reward; training on those 2"
    )
    capped = _rounds([Z, F, S, Z, Z, Z], b=2, k=3).report(0)
    assert (
        capped is not None
        and "kept 1 with reward signal, filtered 4 whose members all got the same" in capped
    )
    assert "and 1 with fewer than 2 usable members" in capped
    assert capped.endswith("cap (6 draws) was reached first: training on those 1 (of 2 wanted)")
    none = _rounds([Z, Z, Z, Z], b=2, k=2).report(0)
    assert none is not None and none.endswith("was reached with none, so no update this step")
    assert _rounds([S, S], b=2, k=4).report(0) is None  # nothing filtered, nothing refilled: nothing to say
    off = StepDraws.of(2, NoDynamicSampling())
    off.issue(2)
    off.record(Z)
    off.record(Z)
    assert off.report(0) is None


def test_off_draws_the_step_once_and_keeps_every_verdict():
    d = StepDraws.of(3, NoDynamicSampling())
    assert list(d.issue(d.need())) == [0, 1, 2] and d.need() == 0
    assert all(d.record(v) for v in (S, Z, F))
    assert (d.filtered, d.capped, d.complete, d.max_draws) == (0, False, True, 3)


def test_more_finished_than_drawn_is_an_error():
    d = StepDraws.of(1, DynamicSampling())
    d.issue(1)
    d.record(S)
    with pytest.raises(ConfigError, match="more groups finished"):
        d.record(S)


@settings(max_examples=200, deadline=None)
@given(
    outcomes=st.lists(st.sampled_from([S, Z, F]), min_size=12, max_size=12),
    b=st.integers(1, 3),
    k=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_rounds_and_one_by_one_draw_the_same_groups(outcomes, b, k, seed):
    outcomes = (outcomes * 2)[: b * k]
    a, c = _rounds(outcomes, b, k), _one_by_one(outcomes, b, k, random.Random(seed))
    assert (a.drawn, a.verdicts) == (c.drawn, c.verdicts)
    # The smallest prefix with b groups with signal, or the cap.
    signal = [i for i, v in enumerate(outcomes) if v is S]
    assert a.drawn == (signal[b - 1] + 1 if len(signal) >= b else b * k)
    assert a.with_signal == min(b, len(signal))


def test_zero_variance_tolerates_rounding_only():
    assert zero_variance([1.0, 1.0, 1.0]) and zero_variance([0.1 * 3, 0.3, 0.30000000000000004])
    assert not zero_variance([1.0, 1.0, 0.999])
    assert zero_variance([5.0]) and zero_variance([])
    with pytest.raises(ConfigError, match="finite"):
        zero_variance([float("nan"), 1.0])


def test_config_is_checked():
    with pytest.raises(ConfigError, match="max-draws"):
        DynamicSampling(max_draws=0)
    assert DynamicSampling().enabled and not NoDynamicSampling().enabled


def test_refills_count_in_flight_and_keep_the_bound():
    adm = Admission(1, 2)  # S = 1, 2 groups per step: capacity 4
    leases = [adm.lease(0) for _ in range(4)]  # steps 0 and 1
    assert [lease.step for lease in leases] == [0, 0, 1, 1] and not adm.can_lease(0)
    assert not adm.can_refill(2, 0)  # a step not started yet gets its own leases first
    assert adm.can_refill(0, 0)  # the learner's step: through even when full
    assert not adm.can_refill(1, 0)  # a later step: waits for room
    r = adm.refill(0, 2, 0)
    assert (r.index, r.step, r.slot) == (-1, 0, 2) and adm.outstanding == 5
    for lease in [*leases[:2], r]:
        adm.complete(lease, 0)
    plan = adm.take(0)
    assert sorted(lease.index for lease in plan.trained) == [-1, 0, 1] and plan.staleness == (0, 0, 0)
    assert adm.can_refill(1, 1) and not adm.can_refill(0, 1)  # step 0 is trained
    with pytest.raises(ConfigError, match="no refill"):
        adm.refill(0, 3, 1)
