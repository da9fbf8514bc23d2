"""VLLMServerPolicy against a real ``vllm serve`` (vLLM's CPU build) on SmolLM2-135M-Instruct, fp32.

Opt-in (marker ``vllm``): starting vLLM takes minutes of CPU. Run with

    AGENTRL_VLLM_PYTHON=/work/vllm-venv/bin/python pytest -m vllm tests/policies/test_vllm_server.py -s

or point ``AGENTRL_VLLM_URL`` at a server already started with ``python -m agentrl.policies.vllm_server``
on ``smollm2`` (fp32; served name ``AGENTRL_VLLM_MODEL``, default ``agentrl``). The tests share one server
and leave its weights as they found them. Measured numbers are printed (``-s``) and recorded in
docs/vllm.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agentrl.audit import audit_trajectory, recompute_logprobs
from agentrl.models import load_model, smollm2_dir
from agentrl.protocols import FinishReason, Sampling, UpdatablePolicy, WeightUpdate
from agentrl.rollout import RolloutConfig, collect
from agentrl.types import Message
from agentrl.weights import weights_checksum

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# The tolerance HFPolicy meets against its own recomputation. vLLM (fp32, its oneDNN GEMMs and paged
# attention) met it here too: max 3.9e-05 over 327 sampled tokens of TIR episodes (docs/vllm.md).
LOGPROB_TOL = 1e-4
TEMPERATURE = 0.7


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def server_url(tmp_path_factory) -> Iterator[str]:
    """A vLLM server on SmolLM2 (fp32): AGENTRL_VLLM_URL's, or one started from AGENTRL_VLLM_PYTHON."""
    url = os.environ.get("AGENTRL_VLLM_URL")
    if url:
        if not _healthy(url.rstrip("/")):
            pytest.skip(f"AGENTRL_VLLM_URL={url} does not answer /health")
        yield url.rstrip("/")
        return
    python = os.environ.get("AGENTRL_VLLM_PYTHON")
    if not python:
        pytest.skip(
            "opt-in: set AGENTRL_VLLM_PYTHON to the python of a venv with vLLM (e.g. "
            "/work/vllm-venv/bin/python, see docs/vllm.md) or AGENTRL_VLLM_URL to a running server"
        )
    if not Path(python).is_file():
        pytest.skip(f"AGENTRL_VLLM_PYTHON={python} does not exist")
    probe = subprocess.run(
        [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"AGENTRL_VLLM_PYTHON={python} has no vllm package")
    from agentrl.policies.vllm_server import server_command

    port = _free_port()
    tmp = tmp_path_factory.mktemp("vllm")
    argv, env = server_command(
        smollm2_dir(),
        python=python,
        port=port,
        extension_dir=tmp / "ext",
        extra_args=["--max-num-seqs", "16"],
    )
    log = (tmp / "server.log").open("w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while not _healthy(url):
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}; log: {tmp / 'server.log'}")
            if time.perf_counter() - t0 > 900:
                pytest.fail(f"vllm serve did not answer in 900 s; log: {tmp / 'server.log'}")
            time.sleep(2)
        print(f"\nvllm serve start-up: {time.perf_counter() - t0:.0f} s")
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="module")
def hf_model():
    """The learner's view of the same weights: SmolLM2 in fp32 through transformers."""
    return load_model(smollm2_dir(), "float32", "cpu")


@pytest.fixture
async def policy(server_url, tok, renderer, tmp_path):
    from agentrl.policies import VLLMServerPolicy

    p = VLLMServerPolicy(
        server_url,
        os.environ.get("AGENTRL_VLLM_MODEL", "agentrl"),
        stop_token_ids=renderer.stop_token_ids,
        tokenizer=tok,
    )
    await p.connect()
    yield p
    await p.aclose()


def _diffs(model, token_ids, logprobs) -> list[float]:
    """|sampler log-prob - recomputed| at every position that has a sampler log-prob."""
    ref = recompute_logprobs(model, token_ids, temperature=TEMPERATURE)
    return [abs(ref[i] - lp) for i, lp in enumerate(logprobs) if lp is not None]


def _turn_diff(model, prompt, g) -> float:
    """The largest |log-prob - recomputed| over one generated turn."""
    return max(_diffs(model, [*prompt, *g.token_ids], [None] * len(prompt) + list(g.logprobs)))


async def test_tir_episodes_through_vllm_pass_the_token_audit(policy, renderer, hf_model, local_sandbox_cls):
    assert isinstance(policy, UpdatablePolicy)
    cfg = RolloutConfig(
        max_turns=3, max_new_tokens=96, max_total_tokens=1024, temperature=TEMPERATURE, audit=True
    )
    t0 = time.perf_counter()
    groups = await collect(
        "math-tir-arith-v0", policy, renderer, n_groups=2, group_size=4, config=cfg, seed=0
    )
    wall = time.perf_counter() - t0
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == 8 and not any(t.infra_failure for t in trajs)
    diffs: list[float] = []
    for t in trajs:
        audit_trajectory(t, renderer)  # ids, mask, segments, stop tokens, decoded text
        diffs += _diffs(hf_model, t.token_ids, t.logprobs)
    n_tokens = sum(t.num_model_tokens for t in trajs)
    turns = sum(t.num_turns for t in trajs)
    tools = sum(1 for t in trajs for m in t.messages if m.role == "tool")
    print(
        f"\n8 TIR episodes: {turns} model turns, {tools} tool results, {n_tokens} sampled tokens in "
        f"{wall:.1f} s ({n_tokens / wall:.1f} tok/s); |logprob - HF| max {max(diffs):.2e} mean "
        f"{statistics.mean(diffs):.2e} over {len(diffs)} tokens; rewards {[t.reward for t in trajs]}"
    )
    assert max(diffs) < LOGPROB_TOL


async def test_a_weight_update_reaches_the_server_and_changes_its_outputs(policy, renderer, hf_model):
    prompt = renderer.render_prompt([Message("user", "What is 17 + 25? Answer with a number.")]).token_ids
    sampling = Sampling(max_new_tokens=24, temperature=TEMPERATURE, seed=1234)
    original = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    v0 = policy.version
    before = await policy.generate(prompt, sampling)
    assert before.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert _turn_diff(hf_model, prompt, before) < LOGPROB_TOL

    # Perturbed weights: the server must sample from them, not from the folder it started with.
    g = torch.Generator().manual_seed(0)
    perturbed = {
        k: v + 0.02 * v.std() * torch.randn(v.shape, generator=g) if v.ndim == 2 else v
        for k, v in original.items()
    }
    # The learner's state_dict keeps SmolLM2's tied head as one tensor under two names; keep it tied.
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]
    await policy.load_weights(WeightUpdate(v0 + 1, perturbed))
    push = policy.last_push
    assert push is not None and push.checksum == weights_checksum(perturbed)
    assert await policy.weights_checksum() == weights_checksum(perturbed)
    assert policy.version == v0 + 1 and await policy.server_version() == v0 + 1
    after = await policy.generate(prompt, sampling)
    assert after.policy_version == v0 + 1
    hf_model.load_state_dict(perturbed)
    try:
        new_diff = _turn_diff(hf_model, prompt, after)
        # The old generation's log-probs are no longer what the (new) weights give.
        old_vs_new = _turn_diff(hf_model, prompt, before)
    finally:
        hf_model.load_state_dict(original)
    assert new_diff < LOGPROB_TOL < old_vs_new
    assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)

    # Restored: the same checksum as the original weights, and the same seeded sample as before.
    await policy.load_weights(WeightUpdate(v0 + 2, original))
    assert await policy.weights_checksum() == weights_checksum(original)
    again = await policy.generate(prompt, sampling)
    assert again.token_ids == before.token_ids
    assert max(abs(a - b) for a, b in zip(again.logprobs, before.logprobs, strict=True)) < 1e-5
    p = policy.last_push
    print(
        f"\nweight push of {p.bytes / 1e6:.0f} MB: checksum+write {p.write_s:.2f} s, server load "
        f"{p.load_s:.2f} s; perturbed: |logprob - HF(new)| max {new_diff:.2e}, old sample vs new weights "
        f"{old_vs_new:.2e}"
    )
