"""The model, batch and settings shared by the FSDP test and its worker processes."""

from __future__ import annotations

import torch

from agentrl.batch import TokenBatch

from .tiny import tiny_llama


def build_case():
    model = tiny_llama(seed=7)
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([9, 7, 5, 8])
    ids = torch.randint(1, 300, (4, 9), generator=g) * (torch.arange(9)[None] < lengths[:, None])
    attn = (torch.arange(9)[None] < lengths[:, None]).long()
    mask = attn.float()
    mask[:, :3] = 0
    batch = TokenBatch(ids, attn, mask, torch.zeros(4, 9), torch.zeros(4, 9), tuple("aabb"), lengths)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0])[:, None] * mask
    cfg = {"policy_loss": "reinforce", "micro_batch_tokens": 10, "max_grad_norm": 0.3}
    return model, batch, adv, cfg
