"""Small helpers for the policy tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def stop_biased(model: Any, stop_ids: Sequence[int], bias: float = 9.0) -> Any:
    """Make a random-init model end its turns after a handful of tokens.

    The bias is added inside the model's forward (a hook on the LM head), so a re-scoring forward pass sees
    the same distribution the sampler did.
    """
    ids = list(stop_ids)

    def hook(_mod: Any, _inp: Any, out: Any) -> Any:
        out = out.clone()
        out[..., ids] += bias
        return out

    model.get_output_embeddings().register_forward_hook(hook)
    return model
