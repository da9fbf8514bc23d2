"""The floor the generation benchmarks compare against: plain ``model.generate``, sampling at temperature 1
with no truncation, exactly ``n`` new tokens per row (``min_new_tokens = max_new_tokens``), so every variant
it is compared with can be given the same number of tokens."""

from __future__ import annotations

from typing import Any

import torch


def sample_exactly(model: Any, ids: torch.Tensor, attn: torch.Tensor, n: int, pad_token_id: int) -> None:
    """Sample ``n`` tokens for every (left-padded) row of ``ids``."""
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=pad_token_id,
        )
    assert out.shape[1] == ids.shape[1] + n
