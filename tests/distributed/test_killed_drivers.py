"""Drivers SIGKILLed mid-run on the Ray runtime resume from the ledger and their newest checkpoint: a
synchronous run (reuses the groups of the killed step it had completed) and a run at ``--max-staleness 1``
(reuses exactly the groups its checkpoint's weights sampled, keeps the bound, and replays).

Both drivers run side by side on the session cluster (the ``killed_drivers`` fixture, killed_drivers.py); the
first of the two tests to run waits for both (about 2 min on 2 idle cores). The two tests are one module so
that under ``-n`` they run on one worker (tests/conftest.py), and the fixture runs once."""

import json
from collections import defaultdict

import pytest

from agentrl import read_trajectories
from agentrl.metrics import read_metrics
from agentrl.models import resolve_tokenizer
from agentrl.replay import load as load_run
from agentrl.trainers.ray import GroupLedger
from agentrl.trainers.replay.reproduce import reproduce_step

pytest.importorskip("ray", reason="the Ray runtime's tests need the ray extra (bash .ci/setup --dev)")

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_a_driver_killed_with_sigkill_resumes_from_the_ledger(killed_drivers):
    k = killed_drivers["sync"]  # 3 steps, killed once two episodes of step 1 were written
    assert k.error is None, k.error
    run, before = k.run, k.before
    traj = run / "trajectories.jsonl"
    assert k.steps_before == [0]
    done_before = k.done_before[1]

    assert k.returncode == 0, (k.stdout + k.stderr)[-3000:]
    assert "resumed" in k.stdout
    assert traj.read_text().splitlines()[: len(before)] == before  # nothing finished was lost or rewritten
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    # Groups of step 1 completed before the kill were reused, not sampled again.
    complete = defaultdict(int)
    for line in before:
        rec = json.loads(line)
        if rec["meta"]["step"] == 1:
            complete[rec["group_id"]] += 1
    reused = sum(n for n in complete.values() if n == 2)
    assert rows[1]["episodes/reused"] == reused and reused >= 2 and done_before >= reused // 2
    with GroupLedger(run / "ledger.jsonl") as ledger:
        for step in range(3):
            c = ledger.check(step, settled=True)
            assert c["trained"] == 4 and c["dropped"] == 0, c
    trained = [t for t in read_trajectories(run) if t.meta.step == 1]
    ids = [t.meta.episode_id for t in trained]
    assert len(ids) == len(set(ids))


@pytest.mark.timeout(900)
def test_a_driver_killed_mid_async_run_resumes_within_the_bound(killed_drivers, tmp_path):
    # 4 steps at S = 1, killed once step 1 is trained (its checkpoint written) and step 2's episodes are
    # under way.
    k = killed_drivers["async"]
    assert k.error is None, k.error
    run, before = k.run, k.before
    traj = run / "trajectories.jsonl"
    assert k.start is not None
    start = k.start

    assert k.returncode == 0, (k.stdout + k.stderr)[-3000:]
    assert "resumed" in k.stdout
    assert traj.read_text().splitlines()[: len(before)] == before  # nothing finished was lost or rewritten
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["staleness/max"] <= 1 and r["async/max_staleness_seen"] <= 1 for r in rows)
    # The resumed run (from the newest checkpoint) reused exactly the complete groups of its steps that
    # weights it still had sampled (every turn's version <= the checkpoint's step).
    (tmp_path / "before.jsonl").write_text("\n".join(before) + "\n")
    members = defaultdict(list)
    for t in read_trajectories(tmp_path / "before.jsonl"):  # a torn last line is skipped
        members[t.meta.group_id].append(t)
    reusable = sum(
        len(ts)
        for ts in members.values()
        if len(ts) == 2
        and ts[0].meta.step >= start
        and max(v for t in ts for v in t.policy_versions) <= start
    )
    assert sum(r["episodes/reused"] for r in rows) == reusable
    with GroupLedger(run / "ledger.jsonl") as led:
        for step in range(4):
            c = led.check(step, settled=True)
            assert c["trained"] == 4 and c["dropped"] == 0, (step, c)
    # What each resumed step trained is within the bound: replay finds and reproduces it.
    tok = resolve_tokenizer("tiny")
    loaded = load_run(run)
    for k in range(4):
        report = reproduce_step(loaded, k, tokenizer=tok)
        assert report.matches, (k, [c for c in report.checks if not c.match])
