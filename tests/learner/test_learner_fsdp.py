"""FSDP2 on CPU with 2 gloo ranks: the sharded step equals the single-process step on the full batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from agentrl.learner import Learner, LearnerConfig

from .fsdp_case import build_case

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # ~6 s on 2 cores (two gloo ranks)
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_two_gloo_ranks_match_single_process(tmp_path):
    model, batch, adv, cfg_kw = build_case()
    learner = Learner(model, LearnerConfig(**cfg_kw), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    single = learner.step(batch, adv)
    single_lp, _ = learner.score(batch)

    port = str(free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "fsdp_worker.py"), str(r), "2", port, str(outs[r])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("FSDP workers hung")
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-4000:]
    res = [json.loads(o.read_text()) for o in outs]
    for r in res:
        # The loss and gradient norm are global (reduced over ranks), equal to the full-batch values.
        assert r["loss"] == pytest.approx(single.loss, abs=1e-6)
        assert r["grad_norm"] == pytest.approx(single.grad_norm, rel=1e-5)
        # Ranks ran the same number of backward passes (padded with empty micro-batches).
        assert r["micro_batches"] == res[0]["micro_batches"]
        # After the (clipped) update, every rank's model scores its rows like the single-process model.
        for k, row in enumerate(r["rows"]):
            got = torch.tensor(r["logprobs"][k])
            assert torch.allclose(got, single_lp[row, : got.numel()], atol=1e-5)
