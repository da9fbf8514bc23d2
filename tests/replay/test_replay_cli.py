"""``agentrl replay`` end to end on the session's real runs (in-process, through the real CLI parser)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.trainers.cli import main

from .helpers import copy_run, strip_tokenizer

pytestmark = pytest.mark.slow


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["replay", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_list_and_filters(scripted_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, str(scripted_run))
    assert rc == 0 and out.rstrip().endswith("16 of 16 trajectories")
    assert "What is" in out and "1 error" in out and "1 ok" in out
    rc, out, _ = _run(capsys, str(scripted_run), "--tool-status", "error", "--json")
    rows = json.loads(out)["list"]
    assert rc == 0 and len(rows) == 4 and all(r["tools"] == {"error": 1} and r["reward"] == 0 for r in rows)
    rc, out, _ = _run(
        capsys, str(scripted_run / "trajectories.jsonl"), "--grep", "syntaxerror", "--limit", "2"
    )
    assert rc == 0 and out.rstrip().endswith("showing 2 of 4 matching trajectories (16 in all)")
    assert out.count("\n") == 1 + 2 + 1


def test_show(scripted_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, str(scripted_run), "--json", "--tool-status", "ok", "--min-reward", "1")
    k = json.loads(out)["list"][0]["index"]
    rc, out, _ = _run(
        capsys, str(scripted_run), "--show", str(k), "--tokens", "--advantages", "--color", "never"
    )
    assert rc == 0
    assert f"trajectory {k}" in out and "call call_0_0: python(" in out and "python call_0_0 ok" in out
    assert "advantage" in out and "[observation|" in out
    rc, out, _ = _run(capsys, str(scripted_run), "--show", str(k), "--color", "always")
    assert rc == 0 and "\x1b[32m" in out
    rc, _, err = _run(capsys, str(scripted_run), "--show", "99")
    assert rc == 2 and "--show 99" in err


def test_step_reproduction(scripted_run: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, _ = _run(capsys, str(scripted_run), "--step", "1")
    assert rc == 0, out
    assert "8 of 16 trajectories" in out and "estimator otb" in out
    assert "step 1: all" in out and "recorded metrics reproduced" in out
    rc, out, _ = _run(capsys, str(scripted_run), "--step", "1", "--no-reproduce")
    assert rc == 0 and "reproduced" not in out

    def bump(row: dict[str, Any]) -> dict[str, Any]:
        if row["step"] == 1:
            row["learn/loss"] = row["learn/loss"] + 1e-3
        return row

    edited = copy_run(scripted_run, tmp_path / "edited", edit_metrics=bump)
    rc, out, _ = _run(capsys, str(edited), "--step", "1")
    assert rc == 1 and "NOT reproduced: learn/loss" in out
    rotated = copy_run(scripted_run, tmp_path / "rotated", checkpoints={2})
    rc, out, err = _run(capsys, str(rotated), "--step", "1")
    assert rc == 2 and "rotated away" in err and "--keep-checkpoints" in err


def test_reexec_rescore(scripted_run: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, _ = _run(capsys, str(scripted_run), "--step", "0", "--reexec", "--rescore")
    assert rc == 0, out
    assert out.count("all identical") == 8 and "rescore: 8 of 8 rewards reproduced" in out
    target: dict[str, Any] = {}

    def forge(i: int, rec: dict[str, Any]) -> dict[str, Any]:
        if not target and rec["tool_calls"] and rec["tool_calls"][0]["status"] == "ok":
            target.update(index=i, call=rec["tool_calls"][0]["call_id"])
            rec["tool_calls"][0]["output"] = "31337"
        return rec

    forged = copy_run(scripted_run, tmp_path / "forged", edit=forge)
    rc, out, _ = _run(capsys, str(forged), "--show", str(target["index"]), "--reexec")
    assert rc == 1
    assert f"{target['call']} python (turn 0): different [ok -> ok]" in out and "-31337" in out
    rc, out, _ = _run(capsys, str(forged), "--check", "--json")
    found = [r for r in json.loads(out)["check"] if r["findings"]]
    assert rc == 1 and [r["index"] for r in found] == [target["index"]]
    assert found[0]["findings"][0]["call_id"] == target["call"]


def test_check_points_at_token(tiny_run: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, _ = _run(capsys, str(tiny_run), "--check")
    assert rc == 0 and "8 of 8 trajectories consistent (8 with the full token audit)" in out

    def shift(i: int, rec: dict[str, Any]) -> dict[str, Any]:
        if i == 2:
            rec["logprobs"] = [None, *rec["logprobs"][:-1]]
        return rec

    broken = copy_run(tiny_run, tmp_path / "broken", edit=shift)
    rc, out, _ = _run(capsys, str(broken), "--check")
    first_model = json.loads((tiny_run / "trajectories.jsonl").read_text().splitlines()[2])[
        "loss_mask"
    ].index(1)
    assert rc == 1 and "trajectory 2 " in out
    assert f"[logprob] @ token {first_model}: token {first_model} is sampled" in out


def test_recompute(tiny_run: Path, scripted_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, str(tiny_run), "--recompute", "--max-diff", "1e-4")
    assert rc == 0 and "recomputed 192 sampled tokens of 8 trajectories" in out and "step-000001" in out
    rc, out, _ = _run(
        capsys,
        str(scripted_run),
        "--recompute",
        "--model",
        str(scripted_run / "checkpoints" / "step-000002"),
        "--max-diff",
        "1",
        "--json",
    )
    rep = json.loads(out)["recompute"]
    assert rc == 1 and rep["max_abs_diff"] > 9 and len(rep["largest"]) == 10
    assert all(d["recorded"] == -0.5 for d in rep["largest"])


def test_html(scripted_run: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    page = tmp_path / "run.html"
    rc, out, _ = _run(
        capsys, str(scripted_run), "--html", str(page), "--advantages", "--recompute", "--step", "1"
    )
    assert rc == 0 and f"wrote {page} (8 trajectories)" in out
    text = page.read_text()
    assert "http://" not in text and "https://" not in text
    assert '"has_advantages":true' in text and '"has_recomputed":true' in text


def test_bare_jsonl(scripted_run: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bare = tmp_path / "episodes.jsonl"
    bare.write_text((scripted_run / "trajectories.jsonl").read_text())
    rc, out, _ = _run(capsys, str(bare), "--step", "0")
    assert rc == 0 and "8 of 16" in out and "not a run directory" in out
    rc, out, err = _run(capsys, str(bare), "--show", "0", "--color", "never")
    assert rc == 0 and "[model|" in out and "recorded with the trajectories" in err  # it names its tokenizer
    strip_tokenizer(bare)  # a file from before trajectories named their tokenizer, outside a run: ids only
    rc, out, _ = _run(capsys, str(bare), "--show", "0", "--color", "never")
    assert rc == 0 and "(no tokenizer: ids only)" in out
    rc, out, _ = _run(
        capsys,
        str(bare),
        "--show",
        "0",
        "--color",
        "never",
        "--tokenizer",
        str(scripted_run / "checkpoints" / "step-000001"),
    )
    assert rc == 0 and "[model|" in out
