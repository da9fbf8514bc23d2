"""The learner benchmark's floor with a chunked LM head (``floor-chunked`` in ``learner_throughput.py``).

Plain Hugging Face training on the packed rows, as the benchmark's ``floor``, except that log π comes from
:func:`agentrl.learner.forward.forward_logprobs` (the LM head applied ``chunk`` tokens at a time, checkpointed
per chunk) instead of the model's full [T, V] logits and loss: no Σπ², no entropy, no PPO. Against it the
learner's memory is compared without the full-logits term the plain floor carries.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from agentrl.batch import TokenBatch, pack_rows
from agentrl.learner.attention import attention_in_effect
from agentrl.learner.forward import forward_logprobs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def floor_chunked_update(
    model: Any,
    opt: torch.optim.Optimizer,
    batch: TokenBatch,
    plans: list[list[list[int]]],
    autocast: bool,
    attention: str | None,
    chunk: int,
) -> float:
    """The floor with a chunked LM head: the same packed rows, passes and step as :func:`floor_update`, but
    log π comes from :func:`forward_logprobs` in ``chunk``-token chunks (no Σπ², no entropy). Returns the
    no-grad pass's seconds."""
    dev = batch.input_ids_B_T.device
    rows = [pack_rows(batch, [row]) for mb in plans for row in mb]
    ctx: Callable[[], Any] = (
        (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if autocast else contextlib.nullcontext
    )

    def lp_of(p: Any) -> torch.Tensor:
        ids, pos = p.input_ids_B_T, p.position_ids_B_T
        with ctx():
            out = forward_logprobs(
                model,
                ids,
                p.attention_mask_B_T,
                chunk_size=chunk,
                with_sum_pi_squared=False,
                position_ids_B_T=pos,
            )
        return out.logprobs_B_T

    with attention_in_effect(model, attention):
        _sync(dev)
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            for p in rows:
                lp_of(p)
        _sync(dev)
        t_score = time.perf_counter() - t0
        model.train()
        opt.zero_grad(set_to_none=True)
        n_total = sum(int(((p.attention_mask_B_T != 0) & (p.position_ids_B_T != 0)).sum()) for p in rows)
        for p in rows:
            (-lp_of(p).sum() / max(n_total, 1)).backward()
    torch.nn.utils.clip_grad_norm_([q for q in model.parameters() if q.grad is not None], 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    _sync(dev)
    return t_score
