"""Admission control and the staleness bound: a property test over many seeds with randomized group and
learner latencies (a simulated event loop), plus the per-token version helpers."""

from __future__ import annotations

import dataclasses
import heapq
import random

import pytest

from agentrl.errors import AuditError, ConfigError
from agentrl.staleness import (
    Admission,
    Lease,
    oldest_version,
    token_versions,
    trajectory_staleness,
    turn_versions,
)
from agentrl.types import Segment, TokenSource, Trajectory, TrajectoryMeta


def simulate(seed: int, S: int, B: int, steps: int, on_stale: str) -> dict:
    """Run a trainer against ``Admission`` in simulated time.

    Groups take a random, heavy-tailed time (a worker/server latency); their first turn samples with the
    version served when it starts (after a random queueing delay), so the oldest token version is >= the
    lease version. The learner trains step k whenever ``ready(k)``, for a random time, then publishes
    version k + 1.
    """
    rng = random.Random(seed)
    adm = Admission(S, B, on_stale=on_stale, end_step=steps)
    now, served, learner_busy_until = 0.0, 0, None
    events: list[tuple[float, int, str, object]] = []
    seq = 0
    oldest: dict[int, int] = {}
    cancelled: set[int] = set()
    trained_steps: list[tuple[int, tuple[Lease, ...], tuple[int, ...]]] = []
    leases: list[Lease] = []
    k = 0

    def push(t, kind, payload):
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, payload))

    def latency():
        if rng.random() < 0.15:  # stragglers
            return rng.uniform(3.0, 12.0)
        return rng.expovariate(1.0)

    while k < steps:
        while adm.can_lease(served):
            lease = adm.lease(served)
            assert lease.version == served and lease.step <= served + S
            leases.append(lease)
            push(now + rng.uniform(0, 0.5), "first_turn", lease)
        if learner_busy_until is None and adm.ready(k):
            plan = adm.take(k)
            for lease in plan.dropped:
                cancelled.add(lease.index)
            assert all(lease.step == k for lease in plan.trained)
            trained_steps.append((k, plan.trained, plan.staleness))
            learner_busy_until = now + rng.uniform(0.2, 3.0)
            push(learner_busy_until, "learned", k)
        if not events:
            raise AssertionError(f"deadlock at step {k}: nothing in flight and the step is not ready")
        now, _, kind, payload = heapq.heappop(events)
        if kind == "first_turn":
            lease = payload
            if lease.index in cancelled:
                continue
            oldest[lease.index] = served  # first turn sampled by the weights served now
            push(now + latency(), "done", lease)
        elif kind == "done":
            lease = payload
            if lease.index in cancelled:
                continue
            adm.complete(lease, oldest[lease.index])
        elif kind == "learned":
            k += 1
            served = k  # publish
            learner_busy_until = None
    in_flight = sum(1 for lease in leases if lease.index not in cancelled and lease.step >= steps)
    return {
        "adm": adm,
        "trained": trained_steps,
        "leases": leases,
        "cancelled": cancelled,
        "in_flight": in_flight,
    }


CASES = [
    (S, B, mode)
    for S in (0, 1, 2, 3)
    for B in (1, 2, 4)
    for mode in ("wait", "drop")
    if not (S == 0 and mode == "drop")
]


@pytest.mark.parametrize(("S", "B", "on_stale"), CASES)
def test_staleness_never_exceeds_the_bound_under_random_latencies(S, B, on_stale):
    for seed in range(60):
        r = simulate(seed, S, B, steps=7, on_stale=on_stale)
        adm: Admission = r["adm"]
        staleness = [s for _, _, ss in r["trained"] for s in ss]
        assert max(staleness) <= S and adm.max_seen == max(staleness) <= S, seed
        assert [k for k, _, _ in r["trained"]] == list(range(7))
        for k, trained, _ in r["trained"]:
            assert trained, f"seed {seed}: step {k} trained on nothing"
            if on_stale == "wait":
                # every group of the step, none dropped: the data of step k is exactly its B tasks
                assert sorted(lease.slot for lease in trained) == list(range(B))
        trained_n = sum(len(t) for _, t, _ in r["trained"])
        # accounting: every lease is trained, dropped, or belongs to a step past the end
        assert len(r["leases"]) == trained_n + adm.dropped_total + r["in_flight"], seed
        if on_stale == "wait":
            assert adm.dropped_total == 0
        if S == 0:  # lock-step: each group starts on the version of the step that trains it
            assert all(lease.version == lease.step for lease in r["leases"])


def test_overlap_happens_and_drop_mode_drops_stragglers():
    overlap = drops = 0
    for seed in range(40):
        r = simulate(seed, 1, 2, steps=6, on_stale="drop")
        overlap += sum(lease.version < lease.step for lease in r["leases"])
        drops += r["adm"].dropped_total
    assert overlap > 0 and drops > 0  # the property test above is not vacuous


def test_capacity_rule_and_errors():
    adm = Admission(1, 2)
    got = [adm.lease(0) for _ in range(4)]
    assert [(lease.step, lease.slot) for lease in got] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert not adm.can_lease(0) and adm.outstanding == 4 == adm.capacity
    assert not adm.can_lease(5)  # capacity, not only versions
    with pytest.raises(ConfigError, match="no lease allowed"):
        adm.lease(0)
    adm.complete(got[0], 0)
    with pytest.raises(ConfigError, match="not in flight"):
        adm.complete(got[0], 0)
    assert not adm.ready(0)
    adm.complete(got[1], 0)
    plan = adm.take(0)
    assert plan.trained == (got[0], got[1]) and plan.staleness == (0, 0)
    assert adm.can_lease(0) is False and adm.can_lease(1)  # step 2 needs version >= 1
    # a group read back from disk whose tokens are too old is dropped, never trained
    adm2 = Admission(1, 1)
    adm2.complete(adm2.lease(0), oldest_version=-3)  # e.g. a group read back from an older run
    plan = adm2.take(0)
    assert plan.trained == () and len(plan.dropped) == 1 and adm2.dropped_total == 1
    for bad in ({"max_staleness": -1, "batch_groups": 1}, {"max_staleness": 0, "batch_groups": 0}):
        with pytest.raises(ConfigError):
            Admission(**bad)
    with pytest.raises(ConfigError, match="needs max_staleness >= 1"):
        Admission(0, 2, on_stale="drop")


def _traj(versions):
    segs = [Segment(TokenSource.PROMPT, 0, 2, -1)]
    ids, mask, lps = [1, 2], [0, 0], [None, None]
    for k in range(len(versions)):
        s = len(ids)
        ids += [5, 6]
        mask += [1, 1]
        lps += [-1.0, -1.0]
        segs.append(Segment(TokenSource.MODEL, s, len(ids), k))
        s = len(ids)
        ids += [7]
        mask += [0]
        lps += [None]
        segs.append(Segment(TokenSource.OBSERVATION, s, len(ids), k))
    return Trajectory(
        token_ids=tuple(ids),
        loss_mask=tuple(mask),
        logprobs=tuple(lps),
        segments=tuple(segs),
        messages=(),
        meta=TrajectoryMeta(policy_version=min(versions)),
        policy_versions=tuple(versions),
    )


def test_token_versions_follow_the_turns():
    t = _traj([4, 5, 4])
    t.validate()
    assert turn_versions(t) == (4, 5, 4)
    assert token_versions(t) == (4, 4, 4, 4, 4, 5, 5, 4, 4, 4, 4)
    assert trajectory_staleness(t, 6) == 2
    assert (t.min_policy_version, t.max_policy_version) == (4, 5)
    same = _traj([3, 3])
    assert turn_versions(same) == (3, 3) and set(token_versions(same)) == {3}


def test_the_typed_field_is_the_one_record_read():
    """Staleness reads ``policy_versions`` only: an ``extra`` key left in memory changes nothing (only a
    file's old keys are read, when it is loaded), and ``meta.policy_version`` must be the oldest turn's."""
    t = _traj([7, 9])
    decoy = dataclasses.replace(t, meta=dataclasses.replace(t.meta, extra={"turn_versions": "1,1"}))
    assert turn_versions(decoy) == (7, 9) and oldest_version([decoy]) == 7
    assert trajectory_staleness(decoy, 9) == 2
    bad = dataclasses.replace(t, meta=dataclasses.replace(t.meta, policy_version=9))
    with pytest.raises(AuditError, match="oldest turn's version is 7"):
        bad.validate()


def test_old_records_load_with_their_per_turn_versions():
    """A file written before the typed field kept a spanning episode's versions as ``meta.extra`` strings
    (``turn_versions`` "4,5,4", ``policy_version_max`` 5); loading it fills ``policy_versions`` and drops
    the keys. An old record of a single version lists none: every turn has ``meta.policy_version``."""
    d = _traj([4, 5, 4]).to_dict()
    del d["policy_versions"]
    d["meta"]["extra"] = {"turn_versions": "4,5,4", "policy_version_max": 5, "difficulty": 2}
    old = Trajectory.from_dict(d)
    assert old.policy_versions == (4, 5, 4) and dict(old.meta.extra) == {"difficulty": 2}
    assert token_versions(old) == token_versions(_traj([4, 5, 4]))
    assert Trajectory.from_dict(old.to_dict()) == old
    single = _traj([3, 3]).to_dict()
    single["policy_versions"] = []  # what a file written before the field holds (or no key at all)
    loaded = Trajectory.from_dict(single)
    assert loaded.policy_versions == () and turn_versions(loaded) == (3, 3)
    assert (loaded.min_policy_version, loaded.max_policy_version) == (3, 3)
