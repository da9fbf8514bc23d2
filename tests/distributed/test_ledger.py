"""The controller's group ledger: transitions, late duplicates, retries, accounting, persistence (no Ray)."""

import json

import pytest

from agentrl.errors import ConfigError, StoreError
from agentrl.trainers.ray import GroupLedger, GroupState, LedgerError
from agentrl.trainers.ray.ledger import group_id


def test_a_group_goes_pending_leased_done_trained():
    led = GroupLedger(lease_s=10)
    assert led.issue(0, [5, 6]) == [(0, 5), (0, 6)]
    e = led.lease("w0", now=100.0)
    assert e is not None and e.key == (0, 5) and e.state is GroupState.LEASED and e.worker == "w0"
    assert e.group_id == group_id(0, 5, 0) == "s0-t5-a0" and e.deadline == 110.0
    assert led.complete(e.key, e.group_id)
    assert led.entries[(0, 5)].state is GroupState.DONE
    assert led.check(0) == {**led.counts(0)}
    with pytest.raises(LedgerError, match="still in flight"):
        led.check(0, settled=True)  # (0, 6) is still pending
    f = led.lease("w1")
    assert f is not None and led.complete(f.key, f.group_id)
    led.mark_trained([(0, 5), (0, 6)])
    c = led.check(0, settled=True)
    assert c["issued"] == c["trained"] == 2
    with pytest.raises(LedgerError, match="already trained"):
        led.issue(0, [5])


def test_a_late_duplicate_of_a_released_lease_is_discarded():
    led = GroupLedger(lease_s=1)
    led.issue(3, [1])
    first = led.lease("w0", now=0.0)
    assert first is not None
    assert [e.key for e in led.expired(now=5.0)] == [(3, 1)]
    led.release(first.key, first.group_id, "lease expired")
    second = led.lease("w1", now=5.0)
    assert second is not None and second.group_id == "s3-t1-a1" != first.group_id
    assert not led.complete(first.key, first.group_id)  # the slow first worker answers late
    assert led.discarded == 1 and led.entries[(3, 1)].state is GroupState.LEASED
    assert led.complete(second.key, second.group_id)
    assert not led.complete(second.key, second.group_id)  # and a repeat of the accepted one too
    assert led.discarded == 2 and led.released == 1
    led.release(first.key, first.group_id, "stale")  # releasing a lease it no longer holds does nothing
    assert led.entries[(3, 1)].state is GroupState.DONE


def test_a_group_is_dropped_after_max_attempts_with_the_reason():
    led = GroupLedger(max_attempts=2)
    led.issue(0, [9])
    for _ in range(2):
        e = led.lease("w")
        assert e is not None
        led.release(e.key, e.group_id, "worker died")
    assert led.lease("w") is None
    (dropped,) = led.dropped(0)
    assert dropped.state is GroupState.DROPPED and dropped.reason == "worker died (2 attempts)"
    c = led.check(0, settled=True)
    assert c["dropped"] == 1 and c["issued"] == 1


def test_the_admission_limit_counts_leased_and_untrained_groups():
    led = GroupLedger()
    led.issue(0, range(4))
    a, b = led.lease("w", limit=2), led.lease("w", limit=2)
    assert a is not None and b is not None and led.lease("w", limit=2) is None
    led.complete(a.key, a.group_id)
    assert led.in_flight() == 2 and led.lease("w", limit=2) is None  # done but not trained still counts
    led.mark_trained([a.key])
    assert led.lease("w", limit=2) is not None


def test_the_ledger_file_survives_the_driver(tmp_path):
    path = tmp_path / "ledger.jsonl"
    led = GroupLedger(path)
    led.issue(1, [10, 11, 12])
    done = led.lease("w0")
    held = led.lease("w1")
    assert done is not None and held is not None
    led.complete(done.key, done.group_id)
    led.close()
    with path.open("a") as f:
        f.write('{"ev": "done", "step": 1, "se')  # a record cut by SIGKILL mid-write
    again = GroupLedger(path)
    st = {k: e.state for k, e in again.entries.items()}
    # The lease died with the driver: that group is pending again, under its next attempt.
    assert st == {(1, 10): GroupState.DONE, (1, 11): GroupState.PENDING, (1, 12): GroupState.PENDING}
    assert again.entries[(1, 11)].reason == "driver restarted"
    nxt = again.lease("w2")
    assert nxt is not None and nxt.key == (1, 11) and nxt.group_id == "s1-t11-a1"
    # A resumed step asks again for a group whose result never reached its disk whole: a new attempt.
    (key,) = again.issue(1, [10])
    assert again.lease("w3") is not None and again.entries[key].group_id == "s1-t10-a1"
    again.close()
    assert all("ev" in json.loads(x) for x in path.read_text().splitlines()[-3:])


def test_bad_ledgers_and_settings_are_refused(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_text('not json\n{"ev": "issue", "step": 0, "seed": 1}\n')
    with pytest.raises(StoreError, match=r"ledger\.jsonl:1: not a ledger record"):
        GroupLedger(path)
    with pytest.raises(ConfigError, match="lease_s"):
        GroupLedger(lease_s=0)
    with pytest.raises(ConfigError, match="max_attempts"):
        GroupLedger(max_attempts=0)
    with pytest.raises(LedgerError, match="unknown"):
        GroupLedger().mark_trained([(0, 0)])
    led = GroupLedger()
    led.issue(0, [1])
    with pytest.raises(LedgerError, match="cannot be dropped: it is pending"):
        led.drop((0, 1), "no")
    e = led.lease("w")
    assert e is not None and led.complete(e.key, e.group_id)
    led.drop(e.key, "every episode failed for infrastructure reasons")
    assert led.check(0, settled=True)["dropped"] == 1


def test_a_resume_from_an_older_checkpoint_rewinds_trained_steps(tmp_path):
    led = GroupLedger(tmp_path / "ledger.jsonl")
    for step in (0, 1, 2):
        led.issue(step, [step])
        e = led.lease("w")
        assert e is not None and led.complete(e.key, e.group_id)
        led.mark_trained([e.key])
    led.close()
    again = GroupLedger(tmp_path / "ledger.jsonl")
    again.rewind(1)  # the checkpoint holds step 1; the updates of steps 1 and 2 were lost
    assert [again.entries[(s, s)].state for s in (0, 1, 2)] == [
        GroupState.TRAINED,
        GroupState.DONE,
        GroupState.DONE,
    ]
    again.issue(2, [2])  # step 2 runs again under a new attempt
    e = again.lease("w")
    assert e is not None and e.group_id == "s2-t2-a1"
    again.close()
    with GroupLedger(tmp_path / "ledger.jsonl") as reread:
        assert reread.entries[(1, 1)].state is GroupState.DONE


def test_concurrent_rollouts_lease_only_their_own_groups_and_abandon_stragglers(tmp_path):
    # Asynchronous training: one rollout per group, several steps in flight at once.
    led = GroupLedger(tmp_path / "ledger.jsonl")
    (a,) = led.issue(0, [10])
    (b,) = led.issue(1, [11])
    got = led.lease("w", keys={b})
    assert got is not None and got.key == b  # not the older pending group of the other rollout
    assert led.lease("w", keys={b}) is None
    got_a = led.lease("w", keys={a})
    assert got_a is not None and got_a.key == a
    assert led.complete(a, got_a.group_id)
    led.mark_trained([a])
    # Step 1 trained without its straggler (--on-stale drop): it is dropped, its late result discarded.
    led.abandon(b, "not finished when its step trained")
    assert not led.complete(b, got.group_id) and led.discarded == 1
    assert led.check(1, settled=True)["dropped"] == 1
    with pytest.raises(LedgerError, match="cannot be abandoned: it is trained"):
        led.abandon(a, "no")
    led.close()
    # A resume from the checkpoint of step 1 redoes step 1: the straggler is pending again, and issued anew.
    again = GroupLedger(tmp_path / "ledger.jsonl")
    assert again.entries[b].state is GroupState.DROPPED
    again.rewind(1)
    assert again.entries[b].state is GroupState.PENDING and again.entries[a].state is GroupState.TRAINED
    again.issue(1, [11])
    e = again.lease("w")
    assert e is not None and e.group_id == "s1-t11-a1"  # its second attempt
    again.close()
