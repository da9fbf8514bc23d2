"""One rank of the LoRA FSDP test: python lora_fsdp_worker.py RANK WORLD PORT OUT_JSON (gloo on CPU).

Same case as fsdp_worker.py, with LoRA adapters injected before FSDP2 shards the model: the optimizer holds
only adapter parameters, and frozen base weights share FSDP units with trainable adapters."""

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
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from agentrl.learner import Learner, LearnerConfig, wrap_fsdp
        from learner.fsdp_case import build_case
        from learner.test_lora import LORA, adapted_case

        model, batch, adv, cfg_kw = build_case()
        adapted = adapted_case(model, LORA)
        model = wrap_fsdp(adapted.model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        learner = Learner(model, LearnerConfig(**cfg_kw), optimizer=torch.optim.SGD(trainable, lr=0.1))
        rows = [0] if rank == 0 else [1, 2, 3]
        shard = batch.select(rows)
        stats = learner.step(shard, adv[rows][:, : shard.seq_len])
        lp, _ = learner.score(shard)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # With cpu_offload the full state lands on rank 0 only.
        base = [v.double().sum() for k, v in full.items() if "lora_" not in k]
        base_sum = float(sum(base)) if base else None
        result = {
            "loss": stats.loss,
            "grad_norm": stats.grad_norm,
            "rows": rows,
            "logprobs": lp.float().cpu().tolist(),
            "sharded": any(type(p).__name__ == "DTensor" for p in model.parameters()),
            "optimizer_params": sum(p.numel() for g in learner.optimizer.param_groups for p in g["params"]),
            "base_sum": base_sum,
        }
        with open(out, "w") as f:
            json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
