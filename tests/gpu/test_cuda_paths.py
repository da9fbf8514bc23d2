"""The CUDA paths, run for real on a GPU and skipped without one: the generation engine (fp32 and bf16, KV
reuse across turns, seeded streams), the learner under bf16 autocast against the CPU fp32 step, FSDP2 over
NCCL, and a short ``agentrl train --device cuda`` with the real sandbox.

CI has no GPU, so these run where one is lent (docs/gpu.md says how, and what came out last time).
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.audit import recompute_logprobs
from agentrl.learner import Learner, LearnerConfig
from agentrl.models import tiny_model
from agentrl.policies.engine import GenerationEngine
from agentrl.protocols import Sampling

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TESTS = Path(__file__).resolve().parents[1]
NEVER = 49151  # a stop id the random model practically never samples first: turns run to max_new_tokens


def _errors(model, prompt, gen) -> list[float]:
    ref = recompute_logprobs(model, [*prompt, *gen.token_ids])[-len(gen.token_ids) :]
    return [abs(a - b) for a, b in zip(ref, gen.logprobs, strict=True)]


def _turns(eng: GenerationEngine, prompts: list[list[int]], seed0: int = 0) -> list:
    return eng.generate_sync(
        prompts, [Sampling(max_new_tokens=16, seed=seed0 + i) for i in range(len(prompts))]
    )


def test_engine_fp32_on_cuda_records_exact_logprobs_across_turns(tok):
    model = tiny_model(tok, seed=2).cuda()
    eng = GenerationEngine(model, stop_token_ids=[NEVER], seed=0, max_batch_size=8)
    assert eng.packed_weights is False  # the CPU packing never applies on CUDA
    prompts = [list(range(100 + 7 * i, 140 + 7 * i)) for i in range(6)]
    first = _turns(eng, prompts)
    for p, g in zip(prompts, first, strict=True):
        assert len(g.token_ids) == 16
        assert max(_errors(model, p, g)) < 2e-3
    # Second turn: each conversation plus a tool observation; the engine reuses the cached prefix.
    reused_before = eng.stats().reused_tokens
    turn2 = [[*p, *g.token_ids, 7, 8, 9] for p, g in zip(prompts, first, strict=True)]
    second = _turns(eng, turn2, seed0=10)
    assert eng.stats().reused_tokens - reused_before >= sum(len(p) + 15 for p in prompts)
    for p, g in zip(turn2, second, strict=True):
        assert max(_errors(model, p, g)) < 2e-3


def test_engine_bf16_on_cuda_logprobs_track_a_full_forward(tok):
    """bf16 decoding with a KV cache and a full bf16 forward round differently; the recorded log-probs must
    still describe the sampled tokens (what the learner's importance ratio starts from)."""
    model = tiny_model(tok, seed=3).to("cuda", torch.bfloat16)
    eng = GenerationEngine(model, stop_token_ids=[NEVER], seed=0, max_batch_size=8)
    prompts = [list(range(300 + 11 * i, 360 + 11 * i)) for i in range(8)]
    gens = _turns(eng, prompts)
    errs = [e for p, g in zip(prompts, gens, strict=True) for e in _errors(model, p, g)]
    print(f"bf16 engine vs full forward: mean |dlogp| {sum(errs) / len(errs):.4f}, max {max(errs):.4f}")
    assert sum(errs) / len(errs) < 0.05 and max(errs) < 0.5
    assert all(math.isfinite(x) for g in gens for x in g.logprobs)


def test_seeded_sampling_repeats_on_cuda(tok):
    model = tiny_model(tok, seed=4).cuda()
    prompts = [list(range(500 + 13 * i, 530 + 13 * i)) for i in range(5)]
    runs = [
        [
            g.token_ids
            for g in _turns(GenerationEngine(model, stop_token_ids=[NEVER], max_batch_size=8), prompts)
        ]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert len({tuple(t) for t in runs[0]}) == 5  # different seeds, different streams


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _case():
    sys.path.insert(0, str(TESTS))
    from learner.fsdp_case import build_case

    return build_case()


def _step(device: str, bf16: bool):
    model, batch, adv, cfg_kw = _case()
    model = model.to(device)
    learner = Learner(
        model,
        LearnerConfig(**cfg_kw, bf16_autocast=bf16),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
    )
    stats = learner.step(batch, adv)
    lp, _ = learner.score(batch)
    return stats, lp.float().cpu()


def test_learner_step_on_cuda_matches_cpu_fp32_and_bf16_autocast_stays_close():
    cpu, cpu_lp = _step("cpu", bf16=False)
    gpu, gpu_lp = _step("cuda", bf16=False)
    assert gpu.loss == pytest.approx(cpu.loss, rel=1e-3, abs=1e-5)
    assert gpu.grad_norm == pytest.approx(cpu.grad_norm, rel=1e-3)
    assert torch.allclose(gpu_lp, cpu_lp, atol=1e-3)
    bf, bf_lp = _step("cuda", bf16=True)
    print(
        f"loss cpu {cpu.loss:.6f} cuda {gpu.loss:.6f} cuda+bf16 {bf.loss:.6f}; grad norm {bf.grad_norm:.4f}"
    )
    assert bf.loss == pytest.approx(cpu.loss, rel=0.05, abs=0.02)
    assert bf.grad_norm == pytest.approx(cpu.grad_norm, rel=0.1)
    assert torch.allclose(bf_lp, cpu_lp, atol=0.1)


def test_auto_checkpointing_measures_the_activation_cost_on_cuda():
    """``auto`` on CUDA: the first step measures a positive per-token cost (two probe passes), a tiny model's
    micro-batches fit (no recompute), a billion-token one would not, and the probes leave no gradient behind:
    the step equals the one taken with checkpointing off."""
    from agentrl.learner.checkpointing import available_bytes, needs_checkpointing
    from agentrl.learner.learner import _COST

    def step(mode: str):
        model, batch, adv, cfg_kw = _case()
        model = model.to("cuda")
        cfg = LearnerConfig(**{**cfg_kw, "gradient_checkpointing": mode})
        learner = Learner(model, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        return learner, learner.step(batch, adv), [p.detach().clone() for p in model.parameters()]

    learner, stats, auto_params = step("auto")
    cost = _COST[learner]
    print(f"activation cost: {cost}")
    assert cost is not None and cost.bytes_per_token > 0
    assert stats.recomputed_micro_batches == 0
    assert needs_checkpointing(10**9, cost, available_bytes(learner.device))
    _, _, off_params = step("off")
    for a, b in zip(auto_params, off_params, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.skipif(not torch.distributed.is_nccl_available(), reason="needs NCCL")
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-params"])
def test_fsdp2_over_nccl_matches_the_plain_cuda_step(tmp_path, bf16):
    """One NCCL rank (one GPU here): fully_shard, the mixed-precision policy and the learner's all-reduces
    of CUDA tensors run for real; the step must equal the unsharded one."""
    plain, plain_lp = _step("cuda", bf16=False)
    out = tmp_path / "rank0.json"
    env = {**os.environ, "AGENTRL_FSDP_DEVICE": "cuda", "AGENTRL_FSDP_BF16": "1" if bf16 else "0"}
    proc = subprocess.run(
        [sys.executable, str(TESTS / "learner" / "fsdp_worker.py"), "0", "1", str(_free_port()), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["backend"] == "nccl" and res["sharded"]
    tol = dict(rel=0.05, abs=0.02) if bf16 else dict(rel=1e-3, abs=1e-5)
    assert res["loss"] == pytest.approx(plain.loss, **tol)
    assert res["grad_norm"] == pytest.approx(plain.grad_norm, rel=0.1 if bf16 else 1e-3)
    atol = 0.1 if bf16 else 1e-3
    # The worker scores rows [0] (rank 0's shard); compare them with the plain learner's same rows.
    lp = torch.tensor(res["logprobs"])
    assert torch.allclose(lp, plain_lp[res["rows"]][:, : lp.shape[1]], atol=atol)


@pytest.mark.parametrize("env", ["calculator-v0", "math-tir-arith-v0"])
def test_agentrl_train_on_cuda_one_step(tmp_path, request, env):
    """The trainer end to end on the GPU (tiny model over the real tokenizer, bf16 by default on CUDA): one
    step, a checkpoint, held-out evaluations, finite learner metrics. The calculator's tool runs in-process;
    the TIR task needs the real sandbox, where it starts."""
    from agentrl.metrics import read_metrics

    if env.startswith("math-tir"):
        request.getfixturevalue("local_sandbox_cls")  # skips, with the reason, where the sandbox cannot start
    run = tmp_path / "r"
    args = ["train", "--env", env, "--model", "tiny", "--device", "cuda", "--steps", "1", "--group-size", "2"]
    args += ["--groups-per-step", "2", "--rollout.max-new-tokens", "24", "--eval.tasks", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.trainers", *args, "--no-progress", "--out", str(run)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["weights"]["device"] == "cuda" and cfg["env"] == env
    (row,) = read_metrics(run)
    assert math.isfinite(row["learn/loss"]) and math.isfinite(row["learn/grad_norm"])
    # fp32 master weights (bf16 compute and sampling): the checkpoint holds the master copy.
    from agentrl.checkpoint import describe_checkpoint
    from agentrl.run import RunDir

    assert describe_checkpoint(RunDir(run).checkpoint(1)).weights_dtype == "float32"
    assert "precision: master float32, compute bfloat16, sampler bfloat16" in proc.stdout
    print(proc.stdout[-1500:])


def test_agentrl_train_on_cuda_moves_nearly_every_master_weight_in_two_steps(tmp_path, tok):
    """The bug this guards against: bf16 weights updated in place lose ~96 % of AdamW's steps at lr 3e-6.
    Two trainer steps on CUDA (defaults: fp32 master, bf16 compute) with reward variance in every step must
    change more than 99 % of the master weights, and the learner's own metric must agree."""
    sys.path.insert(0, str(TESTS))
    from trainers.test_precision import _cfg, _run, _weights

    from agentrl.metrics import read_metrics

    run = _run(_cfg(tmp_path, "cuda", device="cuda", dtype="auto"), tok)
    rows = read_metrics(run)
    assert all(r["learn/adv_abs_mean"] > 0 for r in rows)
    w0 = _weights(run, 1)
    w2 = _weights(run, 2)
    changed = sum(int((w2[k] != w0[k]).sum()) for k in w0) / sum(v.numel() for v in w0.values())
    print(
        f"cuda: step 2 changed {100 * changed:.4f} % of the master weights; unchanged_frac per step "
        f"{[r['learn/unchanged_frac'] for r in rows]}"
    )
    assert changed > 0.99
    assert all(r["learn/unchanged_frac"] < 0.01 for r in rows)
