"""The run record: directory layout, checkpoint naming and listing, typed config, and model resolution."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.checkpoint import CheckpointState, save_checkpoint
from agentrl.errors import ConfigError, StoreError
from agentrl.models import (
    ModelSpec,
    model_folder,
    resolve_device,
    resolve_dtype,
    resolve_model,
    resolve_tokenizer,
    tiny_model,
)
from agentrl.run import Checkpoint, RunDir, checkpoint_name, checkpoint_step


@dataclass(frozen=True)
class Inner:
    lr: float = 1e-3
    """Learning rate."""


@dataclass(frozen=True)
class Settings:
    model: str = "tiny"
    """Model name."""
    steps: int = 2
    """Steps."""
    inner: Inner = field(default_factory=Inner)
    """Nested settings."""


def _fake_checkpoint(run: RunDir, step: int, *, complete: bool = True) -> Checkpoint:
    c = run.checkpoint(step)
    c.model_dir.mkdir(parents=True)
    if complete:
        c.state_path.write_text(json.dumps({"step": step, "policy_version": step, "extra": {}}))
    return c


def test_layout_and_checkpoint_names(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r")
    assert run.config_path == tmp_path / "r" / "config.json"
    assert run.trajectories_path.name == "trajectories.jsonl" and run.metrics_path.name == "metrics.jsonl"
    assert run.checkpoint(3).path == tmp_path / "r" / "checkpoints" / "step-000003"
    assert run.checkpoint(3).model_dir.name == "model" and not run.checkpoint(3).complete
    assert checkpoint_name(12) == "step-000012" and checkpoint_step("step-000012") == 12
    assert checkpoint_step("step-1234567") == 1234567  # past six digits the name just grows
    for other in (".tmp-step-000009-1", "step-", "step-x", "steps-000001"):
        assert checkpoint_step(other) is None
    with pytest.raises(ConfigError, match="non-negative"):
        checkpoint_name(-1)
    assert RunDir(str(tmp_path)).path == tmp_path  # a str path is accepted and kept as a Path
    assert not run.exists() and run.checkpoints() == () and run.latest_checkpoint() is None


def test_every_file_of_a_run_keeps_the_name_earlier_runs_have(tmp_path: Path) -> None:
    """RunDir names every file of a run; these names are the file format (old runs must still load)."""
    run = RunDir(tmp_path)
    names = {
        run.scores_path(3): "scores/step-000003.json",
        run.task_sampler_path(3): "task_sampler/step-000003.json",
        run.eval_report_path("untrained"): "eval-untrained.json",
        run.eval_path: "eval.json",
        run.judge_cache_path: "judge_cache.jsonl",
        run.ledger_path: "ledger.jsonl",
        run.adapter_sync_path: "adapter_sync.jsonl",
        run.tensorboard_path: "tensorboard",
        run.plots_path: "plots",
        run.checkpoint(3).optimizer_path: "checkpoints/step-000003/optimizer.pt",
        run.checkpoint(3).rng_path: "checkpoints/step-000003/rng.pt",
        run.checkpoint(3).state_path: "checkpoints/step-000003/state.json",
    }
    assert {p.relative_to(tmp_path).as_posix(): want for p, want in names.items()} == {
        want: want for want in names.values()
    }


def test_checkpoints_listing_ignores_partial_and_foreign_folders(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    for step in (2, 999_999, 1_000_000):
        _fake_checkpoint(run, step)
    _fake_checkpoint(run, 5, complete=False)  # no state.json: not a checkpoint to load
    (run.checkpoints_path / ".tmp-step-000007-42").mkdir()
    (run.checkpoints_path / "notes.txt").write_text("x")
    # Ordered by step, not by name ("step-1000000" sorts before "step-999999" as text).
    assert run.checkpoint_steps() == (2, 999_999, 1_000_000)
    assert [c.step for c in run.checkpoints(complete=False)] == [2, 5, 999_999, 1_000_000]
    latest = run.latest_checkpoint()
    assert latest is not None and latest.step == 1_000_000
    assert run.find_checkpoint(5) is None and run.find_checkpoint(2) == run.checkpoint(2)


def test_require_checkpoint_says_why_one_is_missing(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    with pytest.raises(StoreError, match=r"no checkpoint step-000001 .*never written \(on disk: none\)"):
        run.require_checkpoint(1)
    for step in (3, 4):
        _fake_checkpoint(run, step)
    assert run.require_checkpoint(4).step == 4
    rotated = r"step-000001 .*rotated away: .* only the newest 2 checkpoints \(on disk: step-3, step-4"
    with pytest.raises(StoreError, match=rotated):
        run.require_checkpoint(1, keep=2)
    with pytest.raises(StoreError, match="rotated away: the run keeps only its newest checkpoints"):
        run.require_checkpoint(2)
    with pytest.raises(StoreError, match="never written"):
        run.require_checkpoint(9, keep=2)


def test_rotation_keeps_the_newest_by_step(tmp_path: Path, tok: Any) -> None:
    model = tiny_model(tok, hidden=16, layers=1)
    run = RunDir(tmp_path)
    for step in (999_999, 1_000_000, 1_000_001):
        state = CheckpointState(step, step, {})
        saved = save_checkpoint(run, model=model, optimizer=None, state=state, keep=2)
        assert saved == run.checkpoint(step) and saved.complete
    assert run.checkpoint_steps() == (1_000_000, 1_000_001)


def test_typed_config_round_trip_and_errors(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "new")
    with pytest.raises(StoreError, match=r"not a run directory: it has no config\.json"):
        run.read_config(Settings)
    cfg = Settings(model="smollm2", inner=Inner(lr=0.5))
    run.write_config(cfg)
    assert run.exists() and run.read_config(Settings) == cfg
    assert json.loads(run.config_path.read_text()) == {"model": "smollm2", "steps": 2, "inner": {"lr": 0.5}}
    assert [p.name for p in run.path.iterdir()] == ["config.json"]  # no temporary file left behind
    run.config_path.write_text('{"model": "tiny", "stepz": 3}')
    with pytest.raises(ConfigError, match=r"config\.json: unknown setting\(s\) \['stepz'\]"):
        run.read_config(Settings)
    run.config_path.write_text('{"model": ')
    with pytest.raises(StoreError, match="unreadable"):
        run.read_config(Settings)


def test_model_spec_is_checked() -> None:
    assert ModelSpec("tiny") == ModelSpec("tiny", seed=0, device="auto", dtype="auto")
    assert ModelSpec("x", device="cuda:1").device == "cuda:1"
    with pytest.raises(ConfigError, match="unknown dtype 'int8'"):
        ModelSpec("tiny", dtype="int8")
    with pytest.raises(ConfigError, match="unknown device 'tpu'"):
        ModelSpec("tiny", device="tpu")
    with pytest.raises(ConfigError, match="non-empty"):
        ModelSpec("")


# ---------------------------------------------------------------------------------------------------
def test_device_and_dtype_rules() -> None:
    cpu = resolve_device("cpu")
    assert cpu.type == "cpu" and resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device is visible"):
            resolve_device("cuda")


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory, tok: Any) -> RunDir:
    """A run directory with two real checkpoints (tiny weights, SmolLM2's tokenizer) as the trainer writes."""
    run = RunDir(tmp_path_factory.mktemp("run"))
    run.write_config(Settings())
    for step in (1, 2):
        model = tiny_model(tok, seed=step, hidden=16, layers=1)
        state = CheckpointState(step, step, {})
        save_checkpoint(run, model=model, optimizer=None, state=state, tokenizer=tok, keep=3)
    return run


def test_tiny_is_rebuilt_from_its_seed(tok: Any) -> None:
    a = resolve_model(ModelSpec("tiny", seed=3, device="cpu"))
    b = resolve_model(ModelSpec("tiny", seed=3, device="cpu", dtype="bfloat16"), tokenizer=False)
    assert a.source == "tiny model rebuilt, seed 3" and a.tokenizer is not None and b.tokenizer is None
    assert a.dtype == torch.float32 and next(b.model.parameters()).dtype == torch.bfloat16
    ref = tiny_model(tok, seed=3)
    for x, y in zip(a.model.state_dict().values(), ref.state_dict().values(), strict=True):
        assert torch.equal(x, y)
    assert model_folder("tiny") is None and resolve_tokenizer("tiny") is resolve_tokenizer("tiny")


def test_a_folder_a_checkpoint_and_a_run_resolve_to_the_same_weights(saved_run: RunDir) -> None:
    newest = saved_run.checkpoint(2)
    assert model_folder(newest.model_dir) == newest.model_dir  # a Hugging Face folder
    assert model_folder(newest.path) == newest.model_dir  # a checkpoint
    assert model_folder(saved_run.path) == newest.model_dir  # a run: its newest checkpoint
    loaded = [resolve_model(ModelSpec(str(p), device="cpu")) for p in (newest.path, saved_run.path)]
    assert {m.source for m in loaded} == {str(newest.model_dir)}
    pairs = zip(loaded[0].model.state_dict().values(), loaded[1].model.state_dict().values(), strict=True)
    assert all(torch.equal(x, y) for x, y in pairs)
    tok = loaded[0].tokenizer
    assert tok is not None and tok is loaded[1].tokenizer  # one tokenizer per folder and process
    assert resolve_tokenizer(saved_run.checkpoint(1).path).get_vocab() == tok.get_vocab()


def test_wrong_model_names_say_what_is_wrong(saved_run: RunDir, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no such folder \(and not 'smollm2' or 'tiny'\)"):
        model_folder(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="is not a Hugging Face model folder"):
        model_folder(tmp_path / "empty")
    fresh = RunDir(tmp_path / "fresh")
    fresh.write_config(Settings())  # a run that has not finished a step yet
    with pytest.raises(ConfigError, match="has no complete checkpoint yet"):
        model_folder(fresh.path)
    no_tok = tmp_path / "no-tok"
    shutil.copytree(saved_run.checkpoint(1).model_dir, no_tok)
    for f in no_tok.iterdir():
        if "token" in f.name or f.suffix == ".jinja":
            f.unlink()
    with pytest.raises(ConfigError, match="holds no tokenizer"):
        resolve_tokenizer(no_tok)
