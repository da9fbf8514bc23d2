"""Checkpoints round-trip weights, optimizer and RNG; metrics log, truncate on resume, and plot."""

import json
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.checkpoint import CheckpointState, load_checkpoint, save_checkpoint
from agentrl.errors import ConfigError, StoreError
from agentrl.metrics import MetricsLogger, plot_run, read_metrics
from agentrl.run import RunDir


def tiny(seed):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg)


def test_checkpoint_round_trip_and_rotation(tmp_path):
    model = tiny(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    opt.step()
    for step in (1, 2, 3):
        save_checkpoint(
            tmp_path,
            model=model,
            optimizer=opt,
            state=CheckpointState(step, step, {"pos": step * 10}),
            keep=2,
        )
    random.seed(5)
    expected_draw = random.random()
    random.seed(5)
    save_checkpoint(tmp_path, model=model, optimizer=opt, state=CheckpointState(4, 4, {"pos": 40}))
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-000003", "step-000004"]
    run = RunDir(tmp_path)
    latest = run.latest_checkpoint()
    assert latest is not None and latest.step == 4 and latest.path.name == "step-000004"
    assert run.checkpoint_steps() == (3, 4)

    other = tiny(1)
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    random.seed(99)
    state = load_checkpoint(latest, model=other, optimizer=other_opt)
    assert state == CheckpointState(4, 4, {"pos": 40})
    assert random.random() == expected_draw  # RNG restored to the moment of saving
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert other_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_checkpoint_errors(tmp_path):
    assert RunDir(tmp_path).latest_checkpoint() is None
    with pytest.raises(StoreError, match="not a complete checkpoint"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(ConfigError, match="keep"):
        save_checkpoint(tmp_path, model=tiny(0), optimizer=None, state=CheckpointState(0, 0, {}), keep=0)
    (tmp_path / "checkpoints" / ".tmp-step-000009-1").mkdir(parents=True)  # a kill mid-write
    assert RunDir(tmp_path).latest_checkpoint() is None


def test_metrics_log_truncate_and_plot(tmp_path):
    log = MetricsLogger(tmp_path)
    for step in range(4):
        log.log(step, {"reward/mean": step / 4, "learn/grad_norm": 1.0 + step, "bad": float("nan")})
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]
    assert read_metrics(tmp_path)[0]["bad"] is None
    log.truncate_from(2)
    log.log(2, {"reward/mean": 0.9, "staleness/max": 0.0})  # all 0 (a synchronous run's): not drawn
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 3, "rew')  # torn last line
    assert len(read_metrics(tmp_path)) == 3
    skipped: list[str] = []
    pngs = plot_run(tmp_path, skipped=skipped)
    assert {p.name for p in pngs} == {"reward.png", "grad_norm.png"} and skipped == ["staleness"]
    zeros = tmp_path / "zeros"  # a run that earned and learned nothing still gets those two plots
    MetricsLogger(zeros).log(0, {"reward/mean": 0.0, "learn/grad_norm": 0.0, "tools/calls_per_episode": 0.0})
    skipped = []
    assert {p.name for p in plot_run(zeros, skipped=skipped)} == {"reward.png", "grad_norm.png"}
    assert skipped == ["tools"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    with pytest.raises(ConfigError, match="unknown metrics backend"):
        MetricsLogger(tmp_path, backends=["mlflow"])
    json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
