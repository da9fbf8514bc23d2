"""Micro-batch and LM-head chunk sizes chosen for the device: CPU keeps the 4 GiB budget's, CUDA sizes from
free memory, an explicit value wins, the trainer prints and records the choice, old config.json loads."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.config import config_from_dict
from agentrl.errors import ConfigError
from agentrl.learner import Learner, LearnerConfig
from agentrl.learner.sizing import ModelShape, device_sizes
from agentrl.trainers.factories import learner_config, precision, prepare_run, resolved
from agentrl.trainers.train_config import TrainConfig

from .tiny import tiny_qwen2

QWEN_05B = dict(
    num_hidden_layers=24,
    hidden_size=896,
    intermediate_size=4864,
    vocab_size=151936,
    num_attention_heads=14,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)


def test_cpu_keeps_the_default_run_budget():
    s = device_sizes("cpu")
    assert (s.micro_batch_tokens, s.chunk_size) == (384, 128)


def test_cuda_sizes_from_free_memory():
    shape = ModelShape.from_config(QWEN_05B)
    assert abs(shape.parameters - 494_032_768) / 494_032_768 < 0.001  # Qwen2.5-0.5B's count, biases aside
    h100 = device_sizes("cuda", shape, free_bytes=78 * 2**30)
    h200 = device_sizes("cuda", shape, free_bytes=139 * 2**30)
    small = device_sizes("cuda", shape, free_bytes=24 * 2**30)
    # The H100 measurement: 16 k-token micro-batches peaked at 53.6 GiB with fp32 weights + autocast.
    assert 12_000 <= h100.micro_batch_tokens <= 20_000 and h100.chunk_size == 1024
    assert small.micro_batch_tokens < h100.micro_batch_tokens < h200.micro_batch_tokens
    assert all(s.micro_batch_tokens % 1024 == 0 for s in (h100, h200, small))
    with pytest.raises(ConfigError, match="does not hold"):
        device_sizes("cuda", shape, free_bytes=6 * 2**30)
    vllm = device_sizes("cuda", shape, free_bytes=78 * 2**30, reserved_bytes=int(0.35 * 80 * 2**30))
    assert vllm.micro_batch_tokens < h100.micro_batch_tokens
    with pytest.raises(ConfigError, match="shape"):
        device_sizes("cuda")


def test_learner_config_zero_means_for_the_device():
    learner = Learner(tiny_qwen2(), LearnerConfig(micro_batch_tokens=0, chunk_size=0))
    assert (learner._budget(), learner._chunk()) == (384, 128)
    explicit = Learner(tiny_qwen2(), LearnerConfig(micro_batch_tokens=50, chunk_size=0))
    assert (explicit._budget(), explicit._chunk()) == (50, 128)
    assert Learner(tiny_qwen2(), LearnerConfig(micro_batch_tokens=None))._budget() is None
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        LearnerConfig(micro_batch_tokens=-1)
    with pytest.raises(ConfigError, match="chunk_size"):
        LearnerConfig(chunk_size=-1)


def test_trainer_records_the_chosen_sizes_and_an_explicit_value_wins(tmp_path, capsys):
    cfg, run = prepare_run(TrainConfig(model="tiny", device="cpu", out=str(tmp_path / "a")))
    # The config keeps what was asked (0: for the device); what this device chose is the run's ResolvedRun.
    assert (cfg.learner.micro_batch_tokens, cfg.learner.chunk_size) == (0, 0)
    found = resolved(cfg, run)
    assert (found.micro_batch_tokens, found.chunk_size) == (384, 128)
    assert "learner: micro_batch_tokens=384 chunk_size=128" in capsys.readouterr().out
    saved = json.loads(run.config_path.read_text())["learner"]
    assert (saved["micro_batch_tokens"], saved["chunk_size"], saved["pack_sequences"]) == (0, 0, True)
    assert json.loads(run.resolved_path.read_text())["micro_batch_tokens"] == 384
    assert learner_config(cfg, precision(cfg, torch.device("cpu")), found).micro_batch_tokens == 384
    # A resume with the default (0) keeps the recorded sizes and counts nothing as changed.
    again, _ = prepare_run(TrainConfig(model="tiny", device="cpu", resume=str(run.path)))
    assert again.learner == cfg.learner and resolved(again, run) == found
    mine = TrainConfig(
        model="tiny", device="cpu", out=str(tmp_path / "b"), learner=LearnerConfig(micro_batch_tokens=512)
    )
    cfg_b, run_b = prepare_run(mine)
    assert cfg_b.learner.micro_batch_tokens == 512
    assert (resolved(cfg_b, run_b).micro_batch_tokens, resolved(cfg_b, run_b).chunk_size) == (512, 1024)


def test_old_config_json_still_loads(tmp_path):
    """Written before pack_sequences existed (and with the sizes as plain numbers, as they were)."""
    _, run = prepare_run(TrainConfig(model="tiny", device="cpu", out=str(tmp_path / "old")))
    data = json.loads(run.config_path.read_text())
    del data["learner"]["pack_sequences"]
    # Runs from before resolved.json kept the chosen sizes in their config.json.
    data["learner"].update(micro_batch_tokens=384, chunk_size=128)
    cfg = config_from_dict(TrainConfig, data)
    assert cfg.learner.pack_sequences and cfg.learner.micro_batch_tokens == 384


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_learner_sizes_itself_on_cuda():
    learner = Learner(tiny_qwen2().cuda(), LearnerConfig(micro_batch_tokens=0, chunk_size=0))
    assert learner._budget() >= 1024 and learner._chunk() >= 128
