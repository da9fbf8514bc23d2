"""Collate groups of trajectories into right-padded token tensors for the learner and the credit
estimators."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.errors import AuditError, ConfigError
from agentrl.groups import TrajectoryGroup

__all__ = ["TokenBatch", "collate"]


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """B trajectories as right-padded [B, T] tensors (T = the longest trajectory)."""

    input_ids_B_T: torch.Tensor
    """Token ids (long); ``pad_id`` after each row's end."""
    attention_mask_B_T: torch.Tensor
    """1 on real tokens, 0 on padding (long)."""
    loss_mask_B_T: torch.Tensor
    """1.0 on tokens the policy sampled, 0.0 on prompt, tool output, template and padding
    (float32)."""
    old_logprobs_B_T: torch.Tensor
    """Log-prob of each sampled token under the behaviour policy (float32; 0 where the mask is 0).
    From the sampler at collate time; replace it with the trainer's own ``Learner.score`` output for
    PPO ratios."""
    token_rewards_B_T: torch.Tensor
    """The episode reward on the row's last model token, 0 elsewhere (float32)."""
    group_ids: tuple[str, ...]
    """The group id of each row: rows sharing an id form one credit-assignment group."""
    lengths_B: torch.Tensor
    """Number of real tokens in each row (long)."""

    @property
    def batch_size(self) -> int:
        """B."""
        return int(self.input_ids_B_T.shape[0])

    @property
    def seq_len(self) -> int:
        """T (padded length)."""
        return int(self.input_ids_B_T.shape[1])

    @property
    def num_model_tokens(self) -> int:
        """Number of tokens with loss mask 1."""
        return int(self.loss_mask_B_T.sum().item())

    def to(self, device: torch.device | str) -> TokenBatch:
        """The same batch on ``device``."""
        return TokenBatch(
            input_ids_B_T=self.input_ids_B_T.to(device),
            attention_mask_B_T=self.attention_mask_B_T.to(device),
            loss_mask_B_T=self.loss_mask_B_T.to(device),
            old_logprobs_B_T=self.old_logprobs_B_T.to(device),
            token_rewards_B_T=self.token_rewards_B_T.to(device),
            group_ids=self.group_ids,
            lengths_B=self.lengths_B.to(device),
        )

    def select(self, rows: Sequence[int]) -> TokenBatch:
        """A sub-batch of ``rows`` (in that order), trimmed to its own longest row."""
        idx = torch.as_tensor(list(rows), dtype=torch.long, device=self.input_ids_B_T.device)
        t = int(self.lengths_B[idx].max().item()) if len(idx) else 0
        return TokenBatch(
            input_ids_B_T=self.input_ids_B_T[idx, :t],
            attention_mask_B_T=self.attention_mask_B_T[idx, :t],
            loss_mask_B_T=self.loss_mask_B_T[idx, :t],
            old_logprobs_B_T=self.old_logprobs_B_T[idx, :t],
            token_rewards_B_T=self.token_rewards_B_T[idx, :t],
            group_ids=tuple(self.group_ids[i] for i in rows),
            lengths_B=self.lengths_B[idx],
        )


def collate(
    groups: Sequence[TrajectoryGroup], pad_id: int, *, device: torch.device | str | None = None
) -> TokenBatch:
    """Stack groups into a :class:`TokenBatch` (right padding with ``pad_id``): one row per member, group
    after group, members in group order; the rows of a group share its ``group_id``.

    Each row's reward (``Trajectory.reward``, the sum of per-step rewards) is placed on its last
    model token; a row without model tokens keeps no reward (it has nothing to train). Trajectories
    marked ``infra_failure`` are refused: the machinery failed, so their reward means nothing; the
    trainer keeps only :meth:`TrajectoryGroup.usable` members. Two groups with one id are refused too
    (credit assignment would merge them).
    """
    if not groups:
        raise ConfigError("collate needs at least one group")
    if not all(isinstance(g, TrajectoryGroup) for g in groups):
        raise ConfigError(
            "collate takes TrajectoryGroup objects (agentrl.groups.group_trajectories builds them from "
            f"trajectories), got {type(groups[0]).__name__}"
        )
    seen: set[str] = set()
    for g in groups:
        if g.group_id in seen:
            raise ConfigError(f"two groups share the group id {g.group_id!r}; credit would merge them")
        seen.add(g.group_id)
    trajectories = [t for g in groups for t in g]
    bad = [tr.meta.episode_id or f"#{i}" for i, tr in enumerate(trajectories) if tr.infra_failure]
    if bad:
        raise ConfigError(
            f"{len(bad)} trajectories are infra failures and must not be trained on "
            f"(drop them before collate): {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}"
        )
    B = len(trajectories)
    T = max(len(tr.token_ids) for tr in trajectories)
    ids = torch.full((B, T), int(pad_id), dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    old = torch.zeros((B, T), dtype=torch.float32)
    rew = torch.zeros((B, T), dtype=torch.float32)
    lengths = torch.zeros(B, dtype=torch.long)
    for i, tr in enumerate(trajectories):
        n = len(tr.token_ids)
        name = tr.meta.episode_id or f"#{i}"
        if len(tr.loss_mask) != n or len(tr.logprobs) != n:
            raise AuditError(
                f"trajectory {name}: {n} token ids, {len(tr.loss_mask)} mask entries, "
                f"{len(tr.logprobs)} log-probs"
            )
        lengths[i] = n
        if n == 0:
            continue
        ids[i, :n] = torch.tensor(tr.token_ids, dtype=torch.long)
        attn[i, :n] = 1
        m = torch.tensor(tr.loss_mask, dtype=torch.float32)
        if bool(((m != 0) & (m != 1)).any()):
            raise AuditError(f"trajectory {name}: loss_mask must be 0/1")
        mask[i, :n] = m
        lps = [0.0 if lp is None else lp for lp in tr.logprobs]
        if any(
            mk and (lp is None or not math.isfinite(lp))
            for mk, lp in zip(tr.loss_mask, tr.logprobs, strict=True)
        ):
            raise AuditError(f"trajectory {name}: a sampled token has no finite log-prob")
        old[i, :n] = torch.tensor(lps, dtype=torch.float32) * m
        pos = torch.nonzero(m).flatten()
        if pos.numel():
            rew[i, int(pos[-1])] = tr.reward
    batch = TokenBatch(
        input_ids_B_T=ids,
        attention_mask_B_T=attn,
        loss_mask_B_T=mask,
        old_logprobs_B_T=old,
        token_rewards_B_T=rew,
        group_ids=tuple(g.group_id for g in groups for _ in g),
        lengths_B=lengths,
    )
    return batch if device is None else batch.to(device)
