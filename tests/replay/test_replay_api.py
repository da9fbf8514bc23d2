"""The ``agentrl.replay`` API on two real runs: listing, rendering, checks, re-execution, re-scoring,
recomputation, step reproduction, and corruptions caught and pointed at."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from agentrl import replay
from agentrl.errors import ConfigError, StoreError
from agentrl.types import TokenSource, ToolStatus, Trajectory

from .helpers import copy_run

pytestmark = pytest.mark.slow  # the session's two training runs take ~30 s; each test is fast after that


def _first_model_segment(t: Trajectory) -> Any:
    return next(s for s in t.segments if s.source is TokenSource.MODEL)


def _with_tool_error(run: replay.Run) -> int:
    return next(
        i for i, t in enumerate(run.trajectories) if any(c.status is ToolStatus.ERROR for c in t.tool_calls)
    )


def _with_ok_tool(run: replay.Run) -> int:
    return next(
        i
        for i, t in enumerate(run.trajectories)
        if any(c.status is ToolStatus.OK for c in t.tool_calls) and t.reward == 1.0
    )


# ---------------------------------------------------------------------------------------------------
def test_load_run_dir_and_jsonl(scripted_run: Path) -> None:
    run = replay.load(scripted_run)
    assert run.run_dir == scripted_run
    assert len(run.trajectories) == 16  # 2 steps x 2 groups x 4
    assert run.setting("estimator.name") == "otb" and run.setting("learner.temperature") == 1.0
    assert run.checkpoint_steps() == (1, 2)
    assert [r["step"] for r in run.metrics] == [0, 1]
    same = replay.load(scripted_run / "trajectories.jsonl")  # a JSONL inside a run dir is that run
    assert same.run_dir == scripted_run and len(same.trajectories) == 16
    with pytest.raises(StoreError, match="does not exist"):
        replay.load(scripted_run / "nope")


def test_filters(scripted_run: Path) -> None:
    run = replay.load(scripted_run)
    ts = run.trajectories
    assert len(replay.filter(ts, step=1)) == 8
    errors = replay.filter(ts, tool_status="error")
    assert len(errors) == 4 and all(t.reward == 0 for t in errors)
    assert replay.filter(ts, errors=True) == errors  # a non-ok tool call counts as an error
    assert len(replay.filter(ts, errors=False)) == 12
    wins = replay.filter(ts, min_reward=1.0)
    assert len(wins) == 8 and all(t.reward == 1.0 for t in wins)
    assert len(replay.filter(ts, max_reward=0.0)) == 8
    assert len(replay.filter(ts, grep="SYNTAXERROR")) == 4  # case-insensitive, in tool output
    g = ts[0].meta.group_id
    assert {t.meta.group_id for t in replay.filter(ts, group=g[:6])} == {g}
    assert len(replay.filter(ts, group=ts[0].meta.task_id)) == 4
    assert len(replay.filter(ts, stop_reason="terminated")) == 16
    assert replay.select(run, step=0, tool_status="ok", min_reward=1) == [
        i for i, t in enumerate(ts) if t.meta.step == 0 and t.reward == 1 and t.tool_calls
    ]


def test_filter_rejects_unknown_values() -> None:
    with pytest.raises(ConfigError, match="unknown stop reason"):
        replay.Filter(stop_reason="finished")
    with pytest.raises(ConfigError, match="unknown tool status"):
        replay.Filter(tool_status="broken")


def test_render_transcript_and_tokens(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    k = _with_tool_error(run)
    t = run.trajectories[k]
    call = t.tool_calls[0]
    text = replay.render(t, tokenizer=tok, index=k)
    assert f"trajectory {k}" in text and t.meta.episode_id in text
    assert f"call {call.call_id}: python(" in text and "→ error" in text
    assert f"python {call.call_id} error" in text and "SyntaxError" in text
    for src in ("[prompt|", "[model|", "[observation|", "[template|"):
        assert src in text  # provenance of every run of tokens, without colour
    assert "\x1b[" not in text
    coloured = replay.render(t, tokenizer=tok, index=k, color=True)
    assert "\x1b[32m" in coloured and "\x1b[36m" in coloured  # model green, observation cyan
    adv = [0.25 if m else None for m in t.loss_mask]
    table = replay.render(t, tokenizer=tok, tokens=True, advantages=adv)
    rows = [ln for ln in table.splitlines() if ln.startswith("  ") and ln.strip()[:1].isdigit()]
    assert len(rows) == t.num_model_tokens
    assert all(ln.rstrip().endswith("0.2500") and "-0.5000" in ln for ln in rows)
    # Without a tokenizer: ids only, still a transcript.
    bare = replay.render(t)
    assert "(no tokenizer: ids only)" in bare and "SyntaxError" in bare


def test_actions_fall_back_to_decoded_model_turns(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    t = run.trajectories[_with_ok_tool(run)]
    acts, source = replay.actions_of(t, tok)
    if t.actions:  # the rollout records them: they must be exactly the decoded turns
        assert source == "recorded"
    else:
        assert source == "decoded"
        with pytest.raises(ConfigError, match="tokenizer"):
            replay.actions_of(t)
    assert len(acts) == t.num_turns == 2
    assert acts[0].startswith("```python\n# plan 0") and acts[1].startswith("Answer: ")
    assert acts[1] == t.messages[_first_model_segment(t).message_index + 2].content


# ---------------------------------------------------------------------------------------------------
def test_check_clean_runs(tiny_run: Path, scripted_run: Path, tok: Any) -> None:
    for path in (tiny_run, scripted_run):
        run = replay.load(path)
        for i, t in enumerate(run.trajectories):
            rep = replay.check(t, tok, index=i)
            assert rep.ok and rep.audited, rep.findings


def test_check_points_at_a_shifted_logprob_column(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    t = run.trajectories[_with_ok_tool(run)]  # two turns: the first one is followed by more tokens
    seg = _first_model_segment(t)
    # Off by one: every log-prob moved one token to the right (a classic realignment bug).
    shifted = dataclasses.replace(t, logprobs=(None, *t.logprobs[:-1]))
    rep = replay.check(shifted, tok)
    assert not rep.ok
    first = rep.findings[0]
    assert first.kind == "logprob" and first.token_index == seg.start
    assert f"token {seg.start} is sampled" in first.message
    assert any(f.token_index == seg.end for f in rep.findings)  # ... and the one past the turn has one


def test_check_points_at_a_shifted_mask(scripted_run: Path, tok: Any) -> None:
    t = replay.load(scripted_run).trajectories[0]
    seg = _first_model_segment(t)
    mask = list(t.loss_mask)
    mask[seg.start - 1], mask[seg.end - 1] = 1, 0  # the mask window slid one token to the left
    rep = replay.check(dataclasses.replace(t, loss_mask=tuple(mask)), tok)
    idx = {f.token_index for f in rep.findings if f.kind == "mask"}
    assert idx == {seg.start - 1, seg.end - 1}
    assert any("template" in f.message or "prompt" in f.message for f in rep.findings if f.kind == "mask")


def test_recompute_points_at_swapped_logprobs(tiny_run: Path, tok: Any) -> None:
    """Values moved inside a turn keep every structural invariant; only a forward pass catches them."""
    run = replay.load(tiny_run)
    t = run.trajectories[0]
    seg = _first_model_segment(t)
    a, b = seg.start + 3, seg.start + 10
    lps = list(t.logprobs)
    lps[a], lps[b] = lps[b], lps[a]
    lps[a] = lps[a] - 2.0  # make sure the swap is visible even if two values were close
    bad = dataclasses.replace(t, logprobs=tuple(lps))
    assert replay.check(bad, tok).ok  # structurally fine
    rep = replay.recompute_run(dataclasses.replace(run, trajectories=(t, bad)), tokenizer=tok, top=3)
    clean, broken = rep.trajectories
    assert clean.max_abs_diff < 1e-4  # the sampler and the learner agree on the real record
    assert broken.worst_token == a and broken.max_abs_diff > 1.0
    assert rep.largest[0].index == 1 and rep.largest[0].token_index == a
    assert rep.largest[0].text == tok.decode([t.token_ids[a]])


def test_recompute_run_uses_each_episodes_weights(tiny_run: Path, tok: Any) -> None:
    run = replay.load(tiny_run)
    rep = replay.recompute_run(run, tokenizer=tok)
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
    ckpt = run.checkpoint_dir(1)
    assert ckpt is not None
    rep = replay.recompute(run.trajectories[8:], ckpt, tokenizer=tok, indices=range(8, 16), top=5)
    assert rep.tokens == sum(t.num_model_tokens for t in run.trajectories[8:])
    # The scripted sampler claims log p = -0.5; the tiny random model gives about -ln(49152) ≈ -10.8.
    assert 9 < rep.mean_abs_diff < 12 and all(d.recorded == -0.5 for d in rep.largest)
    assert all(8 <= d.index < 16 for d in rep.largest) and rep.exceeding(1.0) == 8


# ---------------------------------------------------------------------------------------------------
def test_reexec_and_rescore_reproduce_the_record(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    reports = asyncio.run(
        replay.areexec_many(run.trajectories[:8], env_kwargs=run.setting("env_kwargs"), tokenizer=tok)
    )
    for t, r in zip(run.trajectories, reports, strict=False):
        assert r.ok, (r.index, r.calls, r.steps, r.error)
        assert r.reset_identical and len(r.steps) == t.num_turns
        assert [c.call_id for c in r.calls] == [c.call_id for c in t.tool_calls]
        assert all(c.verdict == "identical" for c in r.calls)
        assert r.replayed_end == r.recorded_end == (True, False)
        s = replay.RescoreReport.from_reexec(r, t)
        assert s.matches and s.replayed_reward == t.reward
    statuses = {c.replayed_status for r in reports for c in r.calls}
    assert statuses == {"ok", "error"}  # both kinds of call really ran again


def test_reexec_points_at_an_edited_tool_output(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    k = _with_ok_tool(run)
    t = run.trajectories[k]
    call = t.tool_calls[0]
    forged_output = str(int(call.output) + 1)
    forged = dataclasses.replace(t, tool_calls=(dataclasses.replace(call, output=forged_output),))
    # Offline: the record no longer matches what the model was shown.
    rep = replay.check(forged, tok, index=k)
    hit = [f for f in rep.findings if f.kind == "tool_output"]
    assert len(hit) == 1 and hit[0].call_id == call.call_id and forged_output in hit[0].message
    # Live: the sandbox disagrees with the forged record.
    rx = replay.reexec(forged, env_kwargs=run.setting("env_kwargs"), tokenizer=tok, index=k)
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
    k = _with_ok_tool(run)
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
    rx = replay.reexec(forged, env_kwargs=run.setting("env_kwargs"), tokenizer=tok)
    assert [c.call_id for c in rx.different_calls] == [call.call_id]
    assert not rx.steps[0].observation_identical and fake in rx.steps[0].diff


def test_rescore_flags_a_wrong_reward(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    t = run.trajectories[_with_ok_tool(run)]
    bad = dataclasses.replace(t, rewards=(0.0, 0.0))
    rep = replay.rescore(bad, env_kwargs=run.setting("env_kwargs"), tokenizer=tok)
    assert not rep.matches and rep.recorded_reward == 0.0 and rep.replayed_reward == 1.0
    assert rep.replayed_rewards == (0.0, 1.0)


def test_reexec_reports_an_env_that_cannot_be_built(scripted_run: Path, tok: Any) -> None:
    t = replay.load(scripted_run).trajectories[0]
    rep = replay.reexec(t, env_kwargs={"no_such_argument": 1}, tokenizer=tok)
    assert not rep.ok and "building the env failed" in rep.error


# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["tiny", "scripted"])
@pytest.mark.parametrize("step", [0, 1])
def test_reproduce_step_matches_metrics(replay_runs: dict[str, Path], which: str, step: int) -> None:
    run = replay.load(replay_runs[which])
    rep = replay.reproduce_step(run, step)
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
    assert (
        len(rep.indices) == len(rep.advantages) == run.setting("group_size") * run.setting("groups_per_step")
    )
    if which == "scripted":
        by = {c.name: c for c in rep.checks}
        assert by["learn/grad_norm"].recorded and by["learn/grad_norm"].recorded > 0  # a real update
        assert by["learn/adv_abs_mean"].recomputed > 0.1
        for i, adv in zip(rep.indices, rep.advantages, strict=True):
            t = run.trajectories[i]
            assert len(adv) == len(t.token_ids)
            assert all((a is None) == (m == 0) for a, m in zip(adv, t.loss_mask, strict=True))
            if t.reward == 1.0:
                assert adv[_first_model_segment(t).start] > 0  # above its group's baseline


def test_step_advantages_match_reproduce(scripted_run: Path) -> None:
    run = replay.load(scripted_run)
    rep = replay.reproduce_step(run, 1)
    adv = replay.step_advantages(run, 1)
    assert sorted(adv) == sorted(rep.indices)
    for i in rep.indices:
        assert adv[i] == rep.advantages_of(i)


def test_reproduce_step_notices_a_wrong_metric(scripted_run: Path, tmp_path: Path) -> None:
    def edit(row: dict[str, Any]) -> dict[str, Any]:
        if row["step"] == 1:
            row["learn/grad_norm"] *= 1.01
        return row

    run = replay.load(copy_run(scripted_run, tmp_path / "run", edit_metrics=edit))
    rep = replay.reproduce_step(run, 1)
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
    rep = replay.reproduce_step(run, 1)
    bad = {c.name for c in rep.checks if not c.match}
    assert {"reward/mean", "learn/adv_abs_mean", "learn/grad_norm"} <= bad


def test_reproduce_step_says_when_the_checkpoint_was_rotated_away(scripted_run: Path, tmp_path: Path) -> None:
    run = replay.load(copy_run(scripted_run, tmp_path / "run", checkpoints={2}))
    with pytest.raises(StoreError, match=r"step-000001.*rotated away.*keeps only the newest 3.*step-2"):
        replay.reproduce_step(run, 1)
    assert replay.reproduce_step(run, 0).matches  # step 0's weights are rebuilt from the config


def test_reproduce_step_errors(scripted_run: Path, tmp_path: Path) -> None:
    run = replay.load(scripted_run)
    with pytest.raises(ConfigError, match="no row for step 7"):
        replay.reproduce_step(run, 7)
    bare = tmp_path / "t.jsonl"
    bare.write_text((scripted_run / "trajectories.jsonl").read_text())
    with pytest.raises(ConfigError, match="not a run directory"):
        replay.reproduce_step(replay.load(bare), 0)
    assert replay.load_tokenizer_for(replay.load(bare)) is None


def test_reports_are_frozen(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    rep = replay.check(run.trajectories[0], tok)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rep.findings = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.trajectories = ()  # type: ignore[misc]
