"""Asynchronous training on the tiny model with the scripted policy (multi-turn guess-number episodes):
S = 0 is the synchronous trainer exactly; S = 1 matches it at step 0 and differs later only through the
correction (replay reproduces every step); weights reach the sampler between turns; staleness holds under
random latencies; resume keeps the bound; bad settings are refused."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest

from agentrl import read_trajectories
from agentrl.credit import GRPO
from agentrl.errors import ConfigError
from agentrl.learner import LearnerConfig
from agentrl.learner.correction import Correction
from agentrl.metrics import read_metrics
from agentrl.replay import load as load_run
from agentrl.rollout import RolloutConfig
from agentrl.staleness import token_versions, turn_versions
from agentrl.testing import RecordingWeightSink, ScriptedPolicy
from agentrl.trainers.evaluate import EvalConfig
from agentrl.trainers.local import local_runtime
from agentrl.trainers.replay.reproduce import reproduce_step
from agentrl.trainers.train import TrainConfig, train
from agentrl.weights import weights_checksum


def _cfg(tmp_path, name, **kw):
    base = TrainConfig(
        model="tiny",
        env="guess-number-v0",
        env_kwargs={"low": 1, "high": 3, "max_guesses": 3},
        group_size=3,
        groups_per_step=2,
        steps=4,
        out=str(tmp_path / name),
        progress=False,
        eval=EvalConfig(tasks=0),  # no test of this module or test_dynamic_sampling.py reads the evaluation
        rollout=RolloutConfig(max_turns=3, max_new_tokens=8, max_total_tokens=512, seed=5, concurrency=16),
        learner=LearnerConfig(lr=5e-3),
        keep_checkpoints=10,
    )
    return dataclasses.replace(base, **kw)


def _sampler(tok, delay_s=0.0):
    """The scripted policy: each turn's guess is a function of the request's seed (so of the task, member
    and turn), never of the order of calls or of the weights; μ = −0.5 on every token."""
    stop = tok.convert_tokens_to_ids("<|im_end|>")

    def turn(prompt_ids, sampling):
        guess = 1 + int(hashlib.sha256(str(sampling.seed).encode()).hexdigest(), 16) % 3
        return [*tok.encode(str(guess), add_special_tokens=False), stop]

    return RecordingWeightSink(ScriptedPolicy(turn, with_sampling=True, stop_ids=[stop], delay_s=delay_s))


def _run(cfg, sampler):
    runtime = functools.partial(local_runtime, sampler=sampler)
    return str(asyncio.run(train(cfg, runtime=runtime)))


def _episodes(run):
    return [(t.meta.step, t.meta.task_id, t.token_ids, t.rewards) for t in read_trajectories(run)]


def _checksums(sink):
    return {u.version: weights_checksum(u.named_tensors) for u in sink.updates}


KEYS = (
    "learn/loss",
    "learn/pg_loss",
    "learn/grad_norm",
    "learn/adv_mean",
    "learn/adv_abs_mean",
    "reward/mean",
)


SYNC_EPISODES = "5f37fc0056387bd9a82295843ec4d8a8bb44bca29b0090fda94a0a82ebd2f665"
SYNC_ROWS = [  # the values of KEYS, step by step
    (
        -0.09999971836805344,
        -0.09999971836805344,
        0.613396942615509,
        0.09999974071979523,
        0.333333283662796,
        0.8333333333333334,
    ),
    (
        -0.07143110781908035,
        -0.07143110781908035,
        0.7333990335464478,
        0.07143110781908035,
        0.16666580736637115,
        0.6666666666666666,
    ),
    (
        -0.14286115765571594,
        -0.14286115765571594,
        0.7651872038841248,
        0.14286115765571594,
        0.42857274413108826,
        0.8333333333333334,
    ),
    (
        -6.903894245624542e-06,
        -6.903894245624542e-06,
        0.4119412302970886,
        6.8951735556765925e-06,
        0.21212349832057953,
        0.8333333333333334,
    ),
]
"""What the synchronous trainer (``_train_step``, before the two loops became one: commit 18df0aa) recorded
for ``_cfg(tmp_path, "sync")``: sha256 of its episodes (step, task, tokens, rewards; sorted) and its metrics.
The one loop at S = 0 reproduced them bit for bit on the machine they were recorded on (2-core x86 CPU);
the floats are compared to 1e-5 here, as another CPU may sum them in another order."""


def test_s0_is_the_synchronous_trainer(tmp_path, tok):
    sink = _sampler(tok)
    run = _run(_cfg(tmp_path, "sync"), sink)
    episodes = _episodes(run)
    assert hashlib.sha256(repr(sorted(episodes, key=repr)).encode()).hexdigest() == SYNC_EPISODES
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for row, pinned in zip(rows, SYNC_ROWS, strict=True):
        assert [row[k] for k in KEYS] == pytest.approx(list(pinned), rel=1e-5, abs=1e-7), row["step"]
        # The asynchronous keys are there too, with what lock step means for them (nothing in flight,
        # dropped or stale; the learner idle for the rollout's share of the step).
        assert row["staleness/max"] == 0.0 and row["async/max_staleness_seen"] == 0.0
        assert row["async/groups_in_flight"] == row["async/groups_dropped_total"] == 0.0
        assert 0.0 < row["async/learner_idle_frac"] <= 1.0 and row["time/generate_s"] > 0.0
    assert any(r["learn/adv_abs_mean"] > 0 for r in rows)  # the comparison is not vacuous
    assert sorted(_checksums(sink)) == [1, 2, 3, 4]


def test_s1_first_step_identical_then_only_the_correction_differs(tmp_path, tok):
    # No latency: the groups complete in the same order as in the synchronous run, so step 0's batch has
    # the same rows in the same order (with latencies its rows may come in another order: the same
    # numbers up to the order of float sums).
    sync_sink, async_sink = _sampler(tok), _sampler(tok)
    sync = _run(_cfg(tmp_path, "sync"), sync_sink)
    asyn = _run(_cfg(tmp_path, "async1", max_staleness=1), async_sink)
    # Same data: the tasks of step k and the scripted tokens do not depend on timing or weights.
    key = lambda e: (e[0], e[1], e[2])  # noqa: E731
    assert sorted(_episodes(sync), key=key) == sorted(_episodes(asyn), key=key)
    rs, ra = read_metrics(sync), read_metrics(asyn)
    # One set of keys, whatever the staleness: a comparison or a plot never branches on it.
    assert all(r.keys() == rs[0].keys() for r in rs + ra)
    for k in KEYS:
        assert ra[0][k] == rs[0][k], k
    assert _checksums(sync_sink)[1] == _checksums(async_sink)[1]
    assert ra[0]["staleness/max"] == 0.0
    assert max(r["staleness/max"] for r in ra) == 1.0 and all(r["staleness/max"] <= 1 for r in ra)
    stale_steps = [r for r in ra if r["staleness/stale_token_frac"] > 0]
    assert stale_steps and all(r["correction/rho_mean"] < 1 for r in stale_steps)
    # Every later step is its recorded trajectories (μ and versions) + the checkpoint it trained from
    # + the correction: replay reproduces it.
    run = load_run(asyn)
    for k in range(4):
        report = reproduce_step(run, k, tokenizer=tok)
        assert report.matches, [c for c in report.checks if not c.match]
        names = {c.name for c in report.checks}
        assert "learn/loss" in names and (
            k == 0 or "correction/rho_mean" in names or "staleness/max" in names
        )
    # Without the correction (ρ̄ ≡ 1) the same data from the same checkpoint gives a different step.
    cfg = json.loads((asyn_path := tmp_path / "async1" / "config.json").read_text())
    cfg["async_"]["correction"]["mode"] = "off"
    asyn_path.write_text(json.dumps(cfg))
    k = next(r["step"] for r in stale_steps)
    off = reproduce_step(load_run(asyn), k, tokenizer=tok)
    assert not off.matches


@pytest.mark.slow  # ~19 s on 2 cores
def test_weights_arrive_between_turns_and_episodes_span_versions(tmp_path, tok):
    # Turns as slow as a learner step, and long episodes: publishes land in the middle of episodes.
    sink = _sampler(tok, delay_s=0.4)
    cfg = _cfg(tmp_path, "span", max_staleness=1, steps=5, env_kwargs={"low": 1, "high": 9, "max_guesses": 4})
    run = _run(dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_turns=4)), sink)
    trajs = list(read_trajectories(run))
    spanning = [t for t in trajs if t.min_policy_version != t.max_policy_version]
    assert spanning, "no episode saw a weight update between its turns"
    for t in trajs:
        vs = turn_versions(t)
        assert vs == t.policy_versions and not {"turn_versions", "policy_version_max"} & set(t.meta.extra)
        assert list(vs) == sorted(vs) and t.meta.policy_version == min(vs)
        assert t.meta.step - t.meta.policy_version <= 1  # staleness of the step that trained it
        per_tok = token_versions(t)
        for seg in t.segments:
            if seg.source.value == "model":  # one version per turn: the turn finished on its weights
                assert len(set(per_tok[seg.start : seg.end])) == 1
    assert max(r["async/max_staleness_seen"] for r in read_metrics(run)) <= 1


@pytest.mark.parametrize("seed", range(3))
def test_staleness_bound_holds_with_random_real_latencies(tmp_path, tok, seed):
    rng = random.Random(seed)
    sink = _sampler(tok, delay_s=lambda: rng.choice([0.0, 0.01, 0.05, 0.2]))
    S = 1 + seed % 2
    run = _run(_cfg(tmp_path, f"lat{seed}", max_staleness=S, steps=3), sink)
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["staleness/max"] <= S and r["async/max_staleness_seen"] <= S for r in rows)
    assert all(t.meta.step - t.meta.policy_version <= S for t in read_trajectories(run))


def test_resume_keeps_the_bound_and_reuses_groups_it_may(tmp_path, tok):
    # Every checkpoint stays resumable (whole): the test resumes from an older one, as a kill would leave it.
    cfg = _cfg(tmp_path, "res", max_staleness=1, steps=4, older_checkpoints="whole")
    run = Path(_run(cfg, _sampler(tok, delay_s=0.01)))
    # As if killed after step 0's checkpoint (step-1): the groups of steps 1..3 are on disk, the updates
    # of steps 1..3 are lost. Groups sampled by versions <= 1 were sampled by weights the resumed run has.
    for ckpt in ("step-000002", "step-000003", "step-000004"):
        shutil.rmtree(run / "checkpoints" / ckpt)
    before = list(read_trajectories(run))
    may_reuse = {t.meta.episode_id for t in before if t.meta.step >= 1 and t.meta.policy_version <= 1}
    later = {t.meta.episode_id for t in before if t.meta.step >= 1} - may_reuse
    assert may_reuse and later  # versions 0..2 sampled the groups of steps 1..3
    _run(dataclasses.replace(cfg, resume=str(run), out=None), _sampler(tok, delay_s=0.01))
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["staleness/max"] <= 1 and r["async/max_staleness_seen"] <= 1 for r in rows)
    assert sum(r["episodes/reused"] for r in rows[1:]) == len(may_reuse)
    after = list(read_trajectories(run))
    assert [t.meta.episode_id for t in after[: len(before)]] == [t.meta.episode_id for t in before]
    # The groups sampled by the lost weights (version 2) were sampled again, never reused.
    new = [t for t in after[len(before) :]]
    assert len(new) == len(later) and all(t.meta.step - t.meta.policy_version <= 1 for t in new)
    for k in (1, 2, 3):  # replay takes each task's last complete group: the one trained
        report = reproduce_step(load_run(run), k, tokenizer=tok)
        assert report.matches, [c for c in report.checks if not c.match]


def test_bad_async_settings_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="max-staleness"):
        _cfg(tmp_path, "x", max_staleness=-1)
    with pytest.raises(ConfigError, match="needs --max-staleness >= 1"):
        _cfg(tmp_path, "x", on_stale="drop")
    with pytest.raises(ConfigError, match="Σπ²"):
        _cfg(tmp_path, "x", max_staleness=1, correction=Correction(mode="bypass"))
    _cfg(tmp_path, "x", max_staleness=1, estimator=GRPO(), correction=Correction(mode="bypass"))


@pytest.mark.slow  # ~19 s on 2 cores
def test_drop_mode_drops_stragglers_within_the_bound(tmp_path, tok):
    calls = iter(range(10**6))
    # Every fifth turn is a straggler (2 s) while the others take 20 ms.
    sink = _sampler(tok, delay_s=lambda: 2.0 if next(calls) % 5 == 4 else 0.02)
    run = _run(_cfg(tmp_path, "drop", max_staleness=1, on_stale="drop", steps=4), sink)
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["staleness/max"] <= 1 for r in rows)
    assert rows[-1]["async/groups_dropped_total"] == sum(r["async/groups_dropped"] for r in rows) > 0
    assert all(r["episodes/total"] >= 3 for r in rows)  # at least one group of 3 per step
    for k in range(4):  # replay finds the groups each step trained (dropped ones are incomplete)
        report = reproduce_step(load_run(run), k, tokenizer=tok)
        assert report.matches, [c for c in report.checks if not c.match]
