"""One rank of the FSDP tests: python fsdp_worker.py RANK WORLD PORT OUT_JSON.

gloo on CPU by default (the 2-rank test); ``AGENTRL_FSDP_DEVICE=cuda`` runs NCCL on the GPU instead and
``AGENTRL_FSDP_BF16=1`` adds the bf16 mixed-precision policy (tests/gpu)."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.set_num_threads(1)
    device = torch.device(os.environ.get("AGENTRL_FSDP_DEVICE", "cpu"))
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from agentrl.learner import Learner, LearnerConfig, wrap_fsdp
        from learner.fsdp_case import build_case

        model, batch, adv, cfg_kw = build_case()
        model = wrap_fsdp(model.to(device), bf16=os.environ.get("AGENTRL_FSDP_BF16") == "1")
        learner = Learner(
            model,
            LearnerConfig(**cfg_kw),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        )
        # Uneven shards on purpose: rank 0 gets 1 row, rank 1 gets 3 (different micro-batch counts).
        rows = [0, 1, 2, 3] if world == 1 else [0] if rank == 0 else [1, 2, 3]
        shard = batch.select(rows)
        t = shard.seq_len
        stats = learner.step(shard, adv[rows][:, :t])
        lp, _ = learner.score(shard)
        result = {
            "loss": stats.loss,
            "grad_norm": stats.grad_norm,
            "micro_batches": stats.micro_batches,
            "rows": rows,
            "logprobs": lp.float().cpu().tolist(),
            "backend": backend,
            "sharded": any(type(p).__name__ == "DTensor" for p in model.parameters()),
        }
        with open(out, "w") as f:
            json.dump(result, f)
        # Both ranks reach this point before either tears gloo down: tearing down while the peer still
        # holds the pair open can abort in gloo's C++ threads
        # ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
