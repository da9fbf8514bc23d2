"""`agentrl train` with bf16 compute on CPU: fp32 master weights in the checkpoints, every step's update
measured (nearly every weight changes), exact resume, and pure bf16 master weights warned about."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json

import torch
from safetensors.torch import load_file

from agentrl.checkpoint import describe_checkpoint
from agentrl.learner import LearnerConfig
from agentrl.metrics import read_metrics
from agentrl.rollout import RolloutConfig
from agentrl.run import RunDir
from agentrl.testing import RecordingWeightSink, ScriptedPolicy
from agentrl.trainers.cli import main as cli_main
from agentrl.trainers.evaluate import EvalConfig
from agentrl.trainers.local import local_runtime
from agentrl.trainers.train import TrainConfig, train

FAST = ["--model", "tiny", "--env", "calculator-v0", "--group-size", "2", "--groups-per-step", "1"]
FAST += ["--rollout.max-new-tokens", "8", "--eval.tasks", "0", "--no-progress", "--steps", "1"]


def _cfg(tmp_path, name, **kw):
    """A run whose groups have reward variance (the tiny random model alone scores 0 everywhere, which
    gives no gradient at all): guess-number with a scripted sampler whose guesses depend on the seed."""
    base = TrainConfig(
        model="tiny",
        env="guess-number-v0",
        env_kwargs={"low": 1, "high": 3, "max_guesses": 1},
        group_size=4,
        groups_per_step=2,
        steps=2,
        out=str(tmp_path / name),
        progress=False,
        dtype="bfloat16",
        rollout=RolloutConfig(max_turns=1, max_new_tokens=8, max_total_tokens=512, seed=5, concurrency=8),
        learner=LearnerConfig(lr=3e-6),  # the default run's learning rate
        keep_checkpoints=5,
        eval=EvalConfig(tasks=0),  # no test here reads the held-out evaluation
    )
    return dataclasses.replace(base, **kw)


def _sampler(tok):
    stop = tok.convert_tokens_to_ids("<|im_end|>")

    def turn(prompt_ids, sampling):
        guess = 1 + int(hashlib.sha256(str(sampling.seed).encode()).hexdigest(), 16) % 3
        return [*tok.encode(str(guess), add_special_tokens=False), stop]

    return RecordingWeightSink(ScriptedPolicy(turn, with_sampling=True, stop_ids=[stop]))


def _run(cfg, tok):
    runtime = functools.partial(local_runtime, sampler=_sampler(tok))
    return asyncio.run(train(cfg, runtime=runtime))


def _weights(run, step):
    out = {}
    for f in sorted(RunDir(run).checkpoint(step).model_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_bf16_compute_changes_the_fp32_master_weights_every_step_and_resumes_exactly(tmp_path, tok):
    straight = _run(_cfg(tmp_path, "straight"), tok)
    rows = read_metrics(straight)
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r["learn/adv_abs_mean"] > 0 for r in rows)  # not vacuous: both steps have a gradient
    for r in rows:
        assert r["learn/unchanged_frac"] < 0.01, r["learn/unchanged_frac"]
        assert r["learn/update_rel_norm"] > 0
    contents = describe_checkpoint(RunDir(straight).checkpoint(2))
    assert contents.weights_dtype == "float32" and contents.optimizer  # master weights, resumable
    w0, w2 = _weights(straight, 1), _weights(straight, 2)
    changed = sum(int((w2[k] != w0[k]).sum()) for k in w0) / sum(v.numel() for v in w0.values())
    assert changed > 0.99  # the second step moved nearly every master weight

    # One step, stop, resume for the second: the same weights bit for bit, the same step-1 metrics.
    split_cfg = _cfg(tmp_path, "split", steps=1)
    split = _run(split_cfg, tok)
    _run(dataclasses.replace(split_cfg, steps=2, resume=str(split), out=None), tok)
    a, b = _weights(straight, 2), _weights(split, 2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    row_a, row_b = read_metrics(straight)[1], read_metrics(split)[1]
    for key in ("learn/loss", "learn/grad_norm", "learn/update_rel_norm", "learn/unchanged_frac"):
        assert row_a[key] == row_b[key], key


def test_pure_bf16_master_weights_lose_the_update_and_the_run_says_so(tmp_path, tok, capsys):
    run = _run(_cfg(tmp_path, "pure", master_dtype="bfloat16", steps=1), tok)
    err = capsys.readouterr().err
    assert "warning: master weights in bfloat16 (--master-dtype)" in err
    assert "of the master weights unchanged" in err  # lr 3e-6 on bf16 weights: the update rounds away
    assert read_metrics(run)[0]["learn/unchanged_frac"] > 0.5
    assert describe_checkpoint(RunDir(run).checkpoint(1)).weights_dtype == "bfloat16"


def test_cli_bf16_compute_samples_from_a_bf16_copy_and_checkpoints_fp32_master(tmp_path, capsys):
    run = tmp_path / "cli"
    assert cli_main(["train", *FAST, "--dtype", "bfloat16", "--out", str(run)]) == 0
    assert "precision: master float32, compute bfloat16, sampler bfloat16" in capsys.readouterr().out
    assert describe_checkpoint(RunDir(run).checkpoint(1)).weights_dtype == "float32"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["weights"]["dtype"] == "bfloat16" and cfg["weights"]["master_dtype"] == "float32"


def test_master_dtype_bf16_needs_bf16_compute(capsys):
    assert cli_main(["train", "--model", "tiny", "--dtype", "float32", "--master-dtype", "bfloat16"]) == 2
    assert "--master-dtype bfloat16 needs --dtype bfloat16" in capsys.readouterr().err
