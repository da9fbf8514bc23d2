"""How the per-token losses of a batch are weighted into one objective (``LearnerConfig.loss_agg``).

Every option is a per-token weight with *global* normalisers (summed over the batch and all ranks), so
micro-batching and data parallelism leave the gradient unchanged:

* ``token-mean``: 1 / (model tokens of the batch). An episode weighs as many tokens as all its samples have.
* ``seq-mean-token-sum``: 1 / (sequences). Each *sample* (row) is a sequence, so an episode split into k
  samples weighs up to k times as much as one that fit in one context.
* ``seq-mean-token-mean``: 1 / (sequence's tokens × sequences): every sample weighs the same, again k per
  k-sample episode.
* ``episode-mean-token-sum``: 1 / (episodes): like ``seq-mean-token-sum`` with an episode's samples counted
  as one sequence.
* ``episode-mean-token-mean``: 1 / (episode's tokens × episodes): every episode weighs the same however many
  samples it has; its tokens (all samples together) share that weight equally.

With one sample per episode the ``episode-*`` options equal their ``seq-*`` counterparts exactly. Rows and
episodes without model tokens are not counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from agentrl.errors import ConfigError

# torch is imported inside the functions that compute: LearnerConfig (and the TrainConfig that holds it)
# needs only this module's names, and the rollout workers and inference servers that unpickle it never
# train (torch costs them ~3 CPU-s and ~300 MB per actor).
if TYPE_CHECKING:
    import torch

__all__ = ["LOSS_AGGS", "LossAgg", "aggregation_weights", "episode_counts"]

LossAgg = Literal[
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "episode-mean-token-sum",
    "episode-mean-token-mean",
]
LOSS_AGGS: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "episode-mean-token-sum",
    "episode-mean-token-mean",
)


def episode_counts(
    seq_tokens_B: torch.Tensor, episode_ids: Sequence[int] | None
) -> tuple[torch.Tensor, float]:
    """([B] model tokens of each row's episode, number of episodes with model tokens). ``episode_ids``: one
    number per row, rows sharing one are an episode's samples; None = every row is an episode."""
    import torch

    if episode_ids is None:
        return seq_tokens_B, float((seq_tokens_B > 0).sum())
    if len(episode_ids) != seq_tokens_B.numel():
        raise ConfigError(f"got {len(episode_ids)} episode ids for {seq_tokens_B.numel()} rows")
    ep = torch.as_tensor(list(episode_ids), dtype=torch.long, device=seq_tokens_B.device)
    _, dense = torch.unique(ep, return_inverse=True)
    per_ep = torch.zeros(
        int(dense.max()) + 1 if dense.numel() else 0, dtype=seq_tokens_B.dtype, device=seq_tokens_B.device
    ).index_add_(0, dense, seq_tokens_B)
    return per_ep[dense], float((per_ep > 0).sum())


def aggregation_weights(
    mask_B_T: torch.Tensor,
    loss_agg: str,
    *,
    n_tokens: float,
    n_sequences: float,
    n_episodes: float,
    episode_tokens_B: torch.Tensor,
) -> torch.Tensor:
    """Per-token weights implementing ``loss_agg`` with the given global counts (see the module docstring);
    ``episode_tokens_B`` is :func:`episode_counts`'s first value."""
    if loss_agg == "token-mean":
        return mask_B_T / max(n_tokens, 1.0)
    if loss_agg == "seq-mean-token-sum":
        return mask_B_T / max(n_sequences, 1.0)
    if loss_agg == "seq-mean-token-mean":
        return mask_B_T / (mask_B_T.sum(dim=1).clamp(min=1.0)[:, None] * max(n_sequences, 1.0))
    if loss_agg == "episode-mean-token-sum":
        return mask_B_T / max(n_episodes, 1.0)
    if loss_agg == "episode-mean-token-mean":
        return mask_B_T / (episode_tokens_B.clamp(min=1.0)[:, None] * max(n_episodes, 1.0))
    raise ConfigError(f"loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")
