"""benchmarks/learner_throughput.py runs end to end at toy size (the qwen-tiny shape: the CUDA configuration's
code path on a CPU) and reports what the docs and the GPU script read."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learner_throughput.py"


def _bench():
    spec = importlib.util.spec_from_file_location("learner_throughput", SCRIPT)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_paired_ratio_pairs_each_repetition():
    """learner/floor is the median of each repetition's floor / agentrl seconds, skipping a repetition that
    one side lost (out of memory): not the ratio of the two medians, which mixes repetitions."""
    paired = _bench().paired_ratio
    assert paired([2.0, None, 3.0], [1.0, 1.0, 4.0]) == 1.375  # median of 2.0 and 0.75
    assert paired([1.0, 4.0, 9.0], [2.0, 8.0, 3.0]) == 0.5  # 0.5, 0.5, 3; the ratio of medians: 4 / 3
    assert paired([None], [1.0]) != paired([None], [1.0])  # NaN: no repetition has both sides


@pytest.mark.slow
def test_learner_throughput_benchmark_runs(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("learner_throughput", SCRIPT)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    argv = ["--shape", "qwen-tiny", "--rows", "5", "--min-len", "8", "--max-len", "40", "--warmup", "0"]
    argv += ["--reps", "1", "--micro-batch-tokens", "64", "--chunk-size", "16", "--bf16-autocast"]
    # eager stands in for CUDA's flex_attention (whose backward does not run on CPU): the same switch of the
    # learner's and the floor's attention, against the SDPA variants.
    argv += ["--attention", "eager", "--variants", "agentrl,agentrl-sdpa,agentrl-padded,floor,floor-sdpa"]
    assert bench.main([*argv, "--out", str(out), "--md", str(md)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    res = json.loads(out.read_text())
    pad = res["variants"]["agentrl"]["padding"]
    assert last == f"learner/floor: {res['learner_over_floor']:.2f}x, padding {pad:.0%}"
    # One repetition: the paired ratio is that repetition's, and the ratio of medians is the same number.
    assert res["learner_over_floor_per_rep"] == [res["learner_over_floor"]]
    assert abs(res["learner_over_floor"] - res["learner_over_floor_of_medians"]) <= 0.002
    assert res["learner_over_floor_cpu"] > 0 and len(res["variants"]["agentrl"]["cpu_seconds"]) == 1
    assert set(res["variants"]) == {"agentrl", "agentrl-sdpa", "agentrl-padded", "floor", "floor-sdpa"}
    assert res["attention"] == {
        "agentrl": "eager",
        "agentrl-sdpa": "sdpa",
        "agentrl-padded": "sdpa",
        "floor": "eager",
        "floor-sdpa": "sdpa",
    }
    assert {"sdpa_over_floor", "padded_over_floor", "sdpa_over_floor_sdpa"} <= set(res)
    assert res["packed"] and res["variants"]["agentrl"]["padding"] <= res["padded_layout_padding"]
    assert "| agentrl |" in md.read_text() and "learner/floor:" in md.read_text()


@pytest.mark.slow
def test_the_long_profile_with_checkpointing_and_the_chunked_floor_runs(tmp_path):
    """The issue-42 additions at toy size: one long row (``--profile long``), the learner with checkpointing
    on, and the floor with a chunked LM head beside the full-logits floor."""
    spec = importlib.util.spec_from_file_location("learner_throughput", SCRIPT)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    argv = ["--shape", "qwen-tiny", "--profile", "long", "--max-len", "300", "--warmup", "0", "--reps", "1"]
    argv += ["--micro-batch-tokens", "512", "--chunk-size", "32"]
    argv += ["--variants", "agentrl,agentrl-ckpt,floor,floor-chunked"]
    assert bench.main([*argv, "--out", str(out), "--md", str(md)]) == 0
    res = json.loads(out.read_text())
    assert res["profile"] == "long" and res["rows"] == 1 and res["real_tokens"] == 300
    assert set(res["variants"]) == {"agentrl", "agentrl-ckpt", "floor", "floor-chunked"}
    assert all(r["tokens_per_s"] > 0 for r in res["variants"].values())
    assert {"ckpt_over_floor", "floor_chunked_over_floor", "floor_chunked_peak_ratio"} <= set(res)
    assert "| floor-chunked |" in md.read_text()
