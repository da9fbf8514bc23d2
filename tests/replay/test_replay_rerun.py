"""``agentrl.trainers.replay`` on two real runs: re-execution and re-scoring in fresh envs, recomputation
with the weights that sampled each episode, step reproduction, and corruptions caught and pointed at."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from agentrl import replay
from agentrl.errors import ConfigError, StoreError
from agentrl.trainers import replay as rerun
from agentrl.types import TokenSource

from .helpers import copy_run, first_model_segment, strip_tokenizer, with_ok_tool

pytestmark = pytest.mark.slow  # the session's two training runs take ~30 s; each test is fast after that


# ---------------------------------------------------------------------------------------------------
def test_recompute_points_at_swapped_logprobs(tiny_run: Path, tok: Any) -> None:
    """Values moved inside a turn keep every structural invariant; only a forward pass catches them."""
    run = replay.load(tiny_run)
    t = run.trajectories[0]
    seg = first_model_segment(t)
    a, b = seg.start + 3, seg.start + 10
    lps = list(t.logprobs)
    lps[a], lps[b] = lps[b], lps[a]
    lps[a] = lps[a] - 2.0  # make sure the swap is visible even if two values were close
    bad = dataclasses.replace(t, logprobs=tuple(lps))
    assert replay.check(bad, tok).ok  # structurally fine
    rep = rerun.recompute_run(dataclasses.replace(run, trajectories=(t, bad)), tokenizer=tok, top=3)
    clean, broken = rep.trajectories
    assert clean.max_abs_diff < 1e-4  # the sampler and the learner agree on the real record
    assert broken.worst_token == a and broken.max_abs_diff > 1.0
    assert rep.largest[0].index == 1 and rep.largest[0].token_index == a
    assert rep.largest[0].text == tok.decode([t.token_ids[a]])


def test_recompute_run_uses_each_episodes_weights(tiny_run: Path, tok: Any) -> None:
    run = replay.load(tiny_run)
    rep = rerun.recompute_run(run, tokenizer=tok)
    assert rep.tokens == sum(t.num_model_tokens for t in run.trajectories)
    assert rep.max_abs_diff < 1e-4 and 0 < rep.mean_sum_pi_squared < 1
    by_version = {
        t.meta.policy_version: r.weights for t, r in zip(run.trajectories, rep.trajectories, strict=True)
    }
    assert "rebuilt" in by_version[0] and by_version[1].endswith("step-000001/model")
    for t, r in zip(run.trajectories, rep.trajectories, strict=True):
        assert len(r.logprobs) == len(t.token_ids)
        assert all((lp is None) == (m == 0) for lp, m in zip(r.logprobs, t.loss_mask, strict=True))
        assert all(sp is None or 0 < sp <= 1 for sp in r.sum_pi_squared)


def test_recompute_shows_the_scripted_samplers_mismatch(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    assert run.run_dir is not None
    ckpt = run.run_dir.require_checkpoint(1)
    rep = rerun.recompute(run.trajectories[8:], ckpt.path, tokenizer=tok, indices=range(8, 16), top=5)
    assert {t.weights for t in rep.trajectories} == {str(ckpt.model_dir)}
    assert rep.tokens == sum(t.num_model_tokens for t in run.trajectories[8:])
    # The scripted sampler claims log p = -0.5; the tiny random model gives about -ln(49152) ≈ -10.8.
    assert 9 < rep.mean_abs_diff < 12 and all(d.recorded == -0.5 for d in rep.largest)
    assert all(8 <= d.index < 16 for d in rep.largest) and rep.exceeding(1.0) == 8


# ---------------------------------------------------------------------------------------------------
def test_reexec_and_rescore_reproduce_the_record(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    reports = asyncio.run(
        rerun.areexec_many(run.trajectories[:8], env_kwargs=rerun.train_config(run).env_kwargs, tokenizer=tok)
    )
    for t, r in zip(run.trajectories, reports, strict=False):
        assert r.ok, (r.index, r.calls, r.steps, r.error)
        assert r.reset_identical and len(r.steps) == t.num_turns
        assert [c.call_id for c in r.calls] == [c.call_id for c in t.tool_calls]
        assert all(c.verdict == "identical" for c in r.calls)
        assert r.replayed_end == r.recorded_end == (True, False)
        s = rerun.RescoreReport.from_reexec(r, t)
        assert s.matches and s.replayed_reward == t.reward
    statuses = {c.replayed_status for r in reports for c in r.calls}
    assert statuses == {"ok", "error"}  # both kinds of call really ran again


def test_reexec_points_at_an_edited_tool_output(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    k = with_ok_tool(run)
    t = run.trajectories[k]
    call = t.tool_calls[0]
    forged_output = str(int(call.output) + 1)
    forged = dataclasses.replace(t, tool_calls=(dataclasses.replace(call, output=forged_output),))
    # Offline: the record no longer matches what the model was shown.
    rep = replay.check(forged, tok, index=k)
    hit = [f for f in rep.findings if f.kind == "tool_output"]
    assert len(hit) == 1 and hit[0].call_id == call.call_id and forged_output in hit[0].message
    # Live: the sandbox disagrees with the forged record.
    rx = rerun.reexec(forged, env_kwargs=rerun.train_config(run).env_kwargs, tokenizer=tok, index=k)
    assert not rx.ok
    (diff,) = rx.different_calls
    assert diff.call_id == call.call_id and diff.verdict == "different"
    assert diff.recorded_output == forged_output and diff.replayed_output == call.output
    assert f"-{forged_output}" in diff.diff and f"+{call.output}" in diff.diff
    # The observations themselves were not edited, so they still replay identically.
    assert all(s.observation_identical for s in rx.steps)


def test_reexec_catches_a_consistently_forged_observation(scripted_run: Path, tok: Any) -> None:
    """Record and tool message edited together (tokens untouched): the audit sees the tokens disagree,
    and the replay sees the env disagree."""
    run = replay.load(scripted_run)
    k = with_ok_tool(run)
    t = run.trajectories[k]
    call = t.tool_calls[0]
    fake = "999"
    msgs = tuple(
        dataclasses.replace(m, content=m.content.replace(call.output, fake))
        if m.role == "tool" and m.tool_call_id == call.call_id
        else m
        for m in t.messages
    )
    forged = dataclasses.replace(t, messages=msgs, tool_calls=(dataclasses.replace(call, output=fake),))
    rep = replay.check(forged, tok)
    audit = [f for f in rep.findings if f.kind == "audit"]
    assert audit and "observation" in audit[0].message and audit[0].token_index is not None
    obs_seg = next(s for s in t.segments if s.source is TokenSource.OBSERVATION)
    assert audit[0].token_index == obs_seg.start
    rx = rerun.reexec(forged, env_kwargs=rerun.train_config(run).env_kwargs, tokenizer=tok)
    assert [c.call_id for c in rx.different_calls] == [call.call_id]
    assert not rx.steps[0].observation_identical and fake in rx.steps[0].diff


def test_rescore_flags_a_wrong_reward(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    t = run.trajectories[with_ok_tool(run)]
    bad = dataclasses.replace(t, rewards=(0.0, 0.0))
    rep = rerun.rescore(bad, env_kwargs=rerun.train_config(run).env_kwargs, tokenizer=tok)
    assert not rep.matches and rep.recorded_reward == 0.0 and rep.replayed_reward == 1.0
    assert rep.replayed_rewards == (0.0, 1.0)


def test_reexec_reports_an_env_that_cannot_be_built(scripted_run: Path, tok: Any) -> None:
    t = replay.load(scripted_run).trajectories[0]
    rep = rerun.reexec(t, env_kwargs={"no_such_argument": 1}, tokenizer=tok)
    assert not rep.ok and "building the env failed" in rep.error


# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["tiny", "scripted"])
@pytest.mark.parametrize("step", [0, 1])
def test_reproduce_step_matches_metrics(replay_runs: dict[str, Path], which: str, step: int) -> None:
    run = replay.load(replay_runs[which])
    cfg = rerun.train_config(run)
    rep = rerun.reproduce_step(run, step)
    assert rep.matches, [c for c in rep.checks if not c.match]
    names = {c.name for c in rep.checks}
    for key in (
        "learn/loss",
        "learn/pg_loss",
        "learn/grad_norm",
        "learn/adv_mean",
        "learn/adv_abs_mean",
        "learn/entropy",
        "learn/sampler_mismatch_max",
        "reward/mean",
        "variance/proxy2_total_power",
    ):
        assert key in names
    assert ("rebuilt" in rep.weights) if step == 0 else rep.weights.endswith("step-000001/model")
    assert len(rep.indices) == len(rep.advantages) == cfg.group_size * cfg.groups_per_step
    if which == "scripted":
        by = {c.name: c for c in rep.checks}
        assert by["learn/grad_norm"].recorded and by["learn/grad_norm"].recorded > 0  # a real update
        assert by["learn/adv_abs_mean"].recomputed > 0.1
        for i, adv in zip(rep.indices, rep.advantages, strict=True):
            t = run.trajectories[i]
            assert len(adv) == len(t.token_ids)
            assert all((a is None) == (m == 0) for a, m in zip(adv, t.loss_mask, strict=True))
            if t.reward == 1.0:
                assert adv[first_model_segment(t).start] > 0  # above its group's baseline


def test_step_advantages_match_reproduce(scripted_run: Path) -> None:
    run = replay.load(scripted_run)
    rep = rerun.reproduce_step(run, 1)
    adv = rerun.step_advantages(run, 1)
    assert sorted(adv) == sorted(rep.indices)
    for i in rep.indices:
        assert adv[i] == rep.advantages_of(i)


def test_reproduce_step_notices_a_wrong_metric(scripted_run: Path, tmp_path: Path) -> None:
    def edit(row: dict[str, Any]) -> dict[str, Any]:
        if row["step"] == 1:
            row["learn/grad_norm"] *= 1.01
        return row

    run = replay.load(copy_run(scripted_run, tmp_path / "run", edit_metrics=edit))
    rep = rerun.reproduce_step(run, 1)
    assert not rep.matches
    assert [c.name for c in rep.checks if not c.match] == ["learn/grad_norm"]


def test_reproduce_step_notices_an_edited_reward(scripted_run: Path, tmp_path: Path) -> None:
    """Flip one reward in the record: the recomputed advantages, loss and reward mean no longer match."""
    first_step1 = next(i for i, t in enumerate(replay.load(scripted_run).trajectories) if t.meta.step == 1)

    def edit(i: int, rec: dict[str, Any]) -> dict[str, Any]:
        if i == first_step1:
            rec["rewards"] = [1.0 - r for r in rec["rewards"]]
            rec["reward"] = sum(rec["rewards"])
        return rec

    run = replay.load(copy_run(scripted_run, tmp_path / "run", edit=edit))
    rep = rerun.reproduce_step(run, 1)
    bad = {c.name for c in rep.checks if not c.match}
    assert {"reward/mean", "learn/adv_abs_mean", "learn/grad_norm"} <= bad


def test_reproduce_step_says_when_the_checkpoint_was_rotated_away(scripted_run: Path, tmp_path: Path) -> None:
    run = replay.load(copy_run(scripted_run, tmp_path / "run", checkpoints={2}))
    with pytest.raises(StoreError, match=r"step-000001.*rotated away.*keeps only the newest 3.*step-2"):
        rerun.reproduce_step(run, 1)
    assert rerun.reproduce_step(run, 0).matches  # step 0's weights are rebuilt from the config


def test_reproduce_step_errors(scripted_run: Path, tmp_path: Path) -> None:
    run = replay.load(scripted_run)
    with pytest.raises(ConfigError, match="no row for step 7"):
        rerun.reproduce_step(run, 7)
    bare = tmp_path / "t.jsonl"
    bare.write_text((scripted_run / "trajectories.jsonl").read_text())
    with pytest.raises(ConfigError, match="not a run directory"):
        rerun.reproduce_step(replay.load(bare), 0)
    assert rerun.load_tokenizer_for(replay.load(bare)) is not None  # the trajectories name their tokenizer
    strip_tokenizer(bare)
    assert rerun.load_tokenizer_for(replay.load(bare)) is None  # an old file outside a run: nothing says


# ---------------------------------------------------------------------------------------------------
def test_a_runs_typed_settings_tokenizer_and_weights(tiny_run: Path, tmp_path: Path, tok: Any) -> None:
    import torch

    from agentrl.learner import LearnerConfig
    from agentrl.models import load_model, tiny_model
    from agentrl.trainers.train import TrainConfig

    run = replay.load(tiny_run)
    cfg = rerun.train_config(run)
    assert isinstance(cfg, TrainConfig) and isinstance(cfg.learner, LearnerConfig)
    assert (cfg.model, cfg.estimator.name, cfg.group_size, cfg.groups_per_step) == ("tiny", "otb", 2, 2)
    # The checkpoint's own tokenizer: the same vocabulary as SmolLM2's.
    run_tok = rerun.load_tokenizer_for(run)
    assert run_tok is not None and run_tok.get_vocab() == tok.get_vocab()
    # Version 0 is rebuilt exactly as the trainer built it; later versions come from their checkpoint.
    v0, what0 = rerun.load_weights(run, 0)
    v1, what1 = rerun.load_weights(run, 1)
    assert what0 == "initial weights (tiny model rebuilt, seed 0)" and what1.endswith("step-000001/model")
    saved = load_model(tiny_run / "checkpoints" / "step-000001" / "model")
    for a, b in zip(v1.state_dict().values(), saved.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    initial = tiny_model(tok, seed=cfg.seed)
    for a, b in zip(v0.state_dict().values(), initial.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    never = r"no checkpoint step-000007 .*never written \(on disk: step-1, step-2\)"
    with pytest.raises(StoreError, match=never):
        rerun.load_weights(run, 7)
    bare = tmp_path / "t.jsonl"
    bare.write_text((tiny_run / "trajectories.jsonl").read_text())
    with pytest.raises(StoreError, match="not inside a run directory"):
        rerun.load_weights(replay.load(bare), 0)
    with pytest.raises(ConfigError, match="not a run directory"):
        rerun.train_config(replay.load(bare))


def test_the_readme_python_example_runs(scripted_run: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """The README's "same from Python" block, as written, on a real run (only its path is swapped)."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "replay.load(" in b]
    assert '"runs/math-tir"' in code
    monkeypatch.chdir(tmp_path)
    exec(compile(code.replace('"runs/math-tir"', repr(str(scripted_run))), "README.md", "exec"), {})
    page = (tmp_path / "run.html").read_text()
    assert '"has_advantages":true' in page and '"vocab":{}' not in page  # token texts came with it
