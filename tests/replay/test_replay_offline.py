"""The offline ``agentrl.replay`` API (no env, no model) on two real runs: loading, filtering, rendering,
the consistency check, and corruptions it catches and points at."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from agentrl import replay
from agentrl.errors import ConfigError, StoreError

from .helpers import first_model_segment, with_ok_tool, with_tool_error

pytestmark = pytest.mark.slow  # the session's two training runs take ~30 s; each test is fast after that


# ---------------------------------------------------------------------------------------------------
def test_load_run_dir_and_jsonl(scripted_run: Path) -> None:
    run = replay.load(scripted_run)
    assert run.run_dir is not None and run.run_dir.path == scripted_run
    assert len(run.trajectories) == 16  # 2 steps x 2 groups x 4
    assert run.checkpoint_steps() == (1, 2)
    assert [r["step"] for r in run.metrics] == [0, 1] and run.metrics_row(1) == run.metrics[1]
    same = replay.load(scripted_run / "trajectories.jsonl")  # a JSONL inside a run dir is that run
    assert same.run_dir == run.run_dir and len(same.trajectories) == 16
    with pytest.raises(StoreError, match="does not exist"):
        replay.load(scripted_run / "nope")
    with pytest.raises(StoreError, match=r"has no trajectories\.jsonl"):
        replay.load(scripted_run / "checkpoints")


def test_a_bare_jsonl_is_no_run(scripted_run: Path, tmp_path: Path) -> None:
    bare = tmp_path / "episodes.jsonl"
    bare.write_text((scripted_run / "trajectories.jsonl").read_text() + '{"torn": ')
    run = replay.load(bare)
    assert run.run_dir is None and run.checkpoint_steps() == () and run.metrics == ()
    assert len(run.trajectories) == 16 and len(run.issues) == 1 and run.issues[0].line == 17


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
    k = with_tool_error(run)
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
    t = run.trajectories[with_ok_tool(run)]
    acts, source = replay.actions_of(t, tok)
    if t.actions:  # the rollout records them: they must be exactly the decoded turns
        assert source == "recorded"
    else:
        assert source == "decoded"
        with pytest.raises(ConfigError, match="tokenizer"):
            replay.actions_of(t)
    assert len(acts) == t.num_turns == 2
    assert acts[0].startswith("```python\n# plan 0") and acts[1].startswith("Answer: ")
    assert acts[1] == t.messages[first_model_segment(t).message_index + 2].content


# ---------------------------------------------------------------------------------------------------
def test_check_clean_runs(tiny_run: Path, scripted_run: Path, tok: Any) -> None:
    for path in (tiny_run, scripted_run):
        run = replay.load(path)
        for i, t in enumerate(run.trajectories):
            rep = replay.check(t, tok, index=i)
            assert rep.ok and rep.audited, rep.findings


def test_check_points_at_a_shifted_logprob_column(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    t = run.trajectories[with_ok_tool(run)]  # two turns: the first one is followed by more tokens
    seg = first_model_segment(t)
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
    seg = first_model_segment(t)
    mask = list(t.loss_mask)
    mask[seg.start - 1], mask[seg.end - 1] = 1, 0  # the mask window slid one token to the left
    rep = replay.check(dataclasses.replace(t, loss_mask=tuple(mask)), tok)
    idx = {f.token_index for f in rep.findings if f.kind == "mask"}
    assert idx == {seg.start - 1, seg.end - 1}
    assert any("template" in f.message or "prompt" in f.message for f in rep.findings if f.kind == "mask")


def test_reports_are_frozen(scripted_run: Path, tok: Any) -> None:
    run = replay.load(scripted_run)
    rep = replay.check(run.trajectories[0], tok)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rep.findings = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.trajectories = ()  # type: ignore[misc]
