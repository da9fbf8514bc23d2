"""agentrl.models: the offline SmolLM2 conversion (locking, atomicity, errors) and tiny models."""

from __future__ import annotations

import importlib.util
import threading
import time

import pytest

from agentrl import models
from agentrl.errors import ConfigError


def test_smollm2_tokenizer_is_the_real_one(tok):
    assert len(tok) == 49152
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert (models.smollm2_dir() / "chat_template.jinja").is_file()


def test_missing_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError, match=r"bash \.ci/setup"):
        models.smollm2_gguf()


def test_conversion_runs_once_under_concurrent_callers(monkeypatch, tmp_path):
    calls = []

    def fake_convert(gguf, out, dtype):
        calls.append(out)
        time.sleep(0.2)  # widen the race window
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(models.smollm2_dir(tmp_path))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1
    assert (results[0] / "config.json").is_file()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # the temp folder was renamed


def test_failed_conversion_leaves_nothing_behind(monkeypatch, tmp_path):
    def broken(gguf, out, dtype):
        (out / "half.bin").write_text("x")
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "_convert_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        models.smollm2_dir(tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []
    with pytest.raises(ConfigError, match="dtype"):
        models.smollm2_dir(tmp_path, dtype="int8")


def test_cache_root_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path


def test_tiny_models(tok):
    m = models.tiny_model(tok, seed=0)
    assert m.config.vocab_size == 49152 and not m.training
    n = sum(p.numel() for p in m.parameters())
    assert 2e6 < n < 5e6
    again = models.tiny_model(tok, seed=0)
    assert all((a == b).all() for a, b in zip(m.parameters(), again.parameters(), strict=True))
    assert models.tiny_model(tok, arch="qwen2").config.model_type == "qwen2"
    with pytest.raises(ConfigError):
        models.tiny_model(tok, arch="gpt9")
