"""Stored trajectories name their tokenizer: collect() and train record it, replay --check finds it."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agentrl import JsonlStore, read_trajectories
from agentrl.errors import StoreError
from agentrl.rollout import RolloutConfig, collect
from agentrl.testing import ScriptedPolicy
from agentrl.tokenizer_id import tokenizer_info
from agentrl.trainers.cli import main

from .helpers import copy_run


def _collect(renderer: Any, path: Path, store: JsonlStore | None = None) -> None:
    import asyncio

    end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    policy = ScriptedPolicy([[*renderer.encode("Answer: 7"), end]], stop_ids=renderer.stop_token_ids)
    cfg = RolloutConfig(max_turns=2, max_new_tokens=32)
    with store or JsonlStore(path) as sink:
        asyncio.run(
            collect("exact-answer-v0", policy, renderer, n_groups=2, group_size=2, store=sink, config=cfg)
        )


def _edit_lines(src: Path, dst: Path, fn: Any) -> Path:
    lines = [json.loads(x) for x in src.read_text().splitlines()]
    dst.write_text("".join(json.dumps(fn(r)) + "\n" for r in lines))
    return dst


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["replay", *args, "--check"])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_fingerprint_tells_tokenizers_apart(tok: Any) -> None:
    info = tokenizer_info(tok)
    assert info is not None and info.vocab_size == 49152 and info.fingerprint.startswith("sha256:")
    assert tokenizer_info(tok) is info  # computed once
    other = copy.deepcopy(tok)
    other.chat_template = (other.chat_template or "") + "{# changed #}"
    assert tokenizer_info(other) is not None and tokenizer_info(other) != info and not info.matches(other)
    other.add_tokens(["<|new|>"])
    changed = tokenizer_info(other)
    assert changed is not None and changed.vocab_size == 49153
    assert tokenizer_info(object()) is None


def test_collect_records_the_tokenizer_and_replay_check_audits_fully(
    renderer: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rollouts.jsonl"
    _collect(renderer, path)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 4
    info = tokenizer_info(renderer.tokenizer)
    assert info is not None and all(r["tokenizer"] == info.to_dict() for r in lines)
    assert all(t.tokenizer == info for t in read_trajectories(path))
    # A bare JSONL file (no run directory) gets the full audit without --tokenizer.
    rc, out, err = _check(capsys, str(path))
    assert rc == 0 and "4 of 4 trajectories consistent (4 with the full token audit)" in out
    assert "(recorded with the trajectories, fingerprint matches)" in err
    # Re-running the script into the same file is refused instead of doubling the records.
    with pytest.raises(StoreError, match=r"rollouts.jsonl already holds.*mode=\"append\""):
        _collect(renderer, path)
    with JsonlStore(path, mode="append") as store:
        _collect(renderer, path, store)
    assert len(path.read_text().splitlines()) == 8


def test_replay_finds_or_refuses_the_tokenizer(
    renderer: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rollouts.jsonl"
    _collect(renderer, path)

    def without(r: dict[str, Any]) -> dict[str, Any]:
        r.pop("tokenizer")
        return r

    # A file from before tokenizers were recorded still loads; --check says how to get the full audit.
    old = _edit_lines(path, tmp_path / "old.jsonl", without)
    rc, out, err = _check(capsys, str(old))
    assert rc == 0 and "(0 with the full token audit)" in out and "pass --tokenizer" in err
    rc, out, err = _check(capsys, str(old), "--tokenizer", "smollm2")
    assert "(4 with the full token audit)" in out and "smollm2 (--tokenizer)" in err
    # The recorded folder is gone (another machine): found by its fingerprint.
    moved = _edit_lines(
        path, tmp_path / "moved.jsonl", lambda r: r | {"tokenizer": r["tokenizer"] | {"name": "/gone"}}
    )
    rc, out, err = _check(capsys, str(moved))
    assert (
        "(4 with the full token audit)" in out and "/gone (recorded with" in err and "found as smollm2" in err
    )
    # A tokenizer this machine does not have: no silent look-alike.
    alien = _edit_lines(
        path,
        tmp_path / "alien.jsonl",
        lambda r: r | {"tokenizer": r["tokenizer"] | {"fingerprint": "sha256:0"}},
    )
    rc, out, err = _check(capsys, str(alien))
    assert "(0 with the full token audit)" in out and "not on this machine; pass --tokenizer" in err
    rc, out, err = _check(capsys, str(alien), "--tokenizer", "smollm2")
    assert "does NOT match the recorded tokenizer" in err


def test_train_records_the_tokenizer_and_old_runs_fall_back(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert all(
        t.tokenizer is not None and t.tokenizer.vocab_size == 49152 for t in read_trajectories(tiny_run)
    )
    rc, out, err = _check(capsys, str(tiny_run))
    assert rc == 0 and "(8 with the full token audit)" in out and "recorded with the trajectories" in err

    def without(i: int, r: dict[str, Any]) -> dict[str, Any]:
        r.pop("tokenizer")
        return r

    old = copy_run(tiny_run, tmp_path / "old", edit=without)
    rc, out, err = _check(capsys, str(old))
    assert rc == 0 and "(8 with the full token audit)" in out
    assert "step-000002/model (the run's; the trajectories name no tokenizer)" in err
