"""Collate groups of trajectories into right-padded token tensors for the learner and the credit
estimators, and pack rows end to end (no padding between sequences) for the learner's forward passes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.errors import AuditError, ConfigError
from agentrl.groups import TrajectoryGroup

__all__ = ["PackedBatch", "TokenBatch", "collate", "pack_rows"]


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
    episode_ids: tuple[int, ...] = ()
    """The episode of each row when some episode has several samples (rows sharing a number are one
    episode's samples, in sampling order); empty when every row is an episode of its own."""

    @property
    def episode_ids_or_none(self) -> tuple[int, ...] | None:
        """:attr:`episode_ids` as the credit estimators and the learner take them (None: one row each)."""
        return self.episode_ids or None

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
            episode_ids=self.episode_ids,
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
            episode_ids=tuple(self.episode_ids[i] for i in rows) if self.episode_ids else (),
        )


def collate(
    groups: Sequence[TrajectoryGroup], pad_id: int, *, device: torch.device | str | None = None
) -> TokenBatch:
    """Stack groups into a :class:`TokenBatch` (right padding with ``pad_id``): one row per member, group
    after group, members in group order; the rows of a group share its ``group_id``.

    Each row's reward (``Trajectory.reward``, the sum of per-step rewards) is placed on its last
    model token; a row without model tokens keeps no reward (it has nothing to train), except in a
    multi-sample episode, where it goes to the last model token of the episode's latest earlier sample that
    has one (so the tokens before it still see it in their reward-to-go). The rows of a multi-sample
    episode are consecutive, in sampling order, and share a number in ``episode_ids``. Trajectories
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
    episode_of = [k for k, e in enumerate(e for g in groups for e in g.episodes) for _ in e]
    last_model: dict[int, tuple[int, int]] = {}  # episode -> (row, column) of its latest model token
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
            last_model[episode_of[i]] = (i, int(pos[-1]))
        elif tr.reward and episode_of[i] in last_model:  # an empty sample's reward, to the sample before
            r, t = last_model[episode_of[i]]
            rew[r, t] += tr.reward
    batch = TokenBatch(
        input_ids_B_T=ids,
        attention_mask_B_T=attn,
        loss_mask_B_T=mask,
        old_logprobs_B_T=old,
        token_rewards_B_T=rew,
        group_ids=tuple(g.group_id for g in groups for _ in g),
        lengths_B=lengths,
        episode_ids=tuple(episode_of) if episode_of[-1] + 1 < B else (),  # () when no episode has 2 rows
    )
    return batch if device is None else batch.to(device)


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """Rows of a :class:`TokenBatch` laid end to end in B' packed rows of T' tokens, without padding between
    sequences (only after a packed row's last sequence, up to T').

    Positions restart at 0 at each sequence's start (``position_ids_B_T``), which is how Hugging Face causal
    LMs tell packed sequences apart and keep attention inside each one. The source index maps every packed
    position back to its (row, token) in the source batch, so per-token tensors move between the two layouts
    with :meth:`gather` and :meth:`scatter`.
    """

    input_ids_B_T: torch.Tensor
    """Token ids of the packed rows (long); 0 after a packed row's end."""
    attention_mask_B_T: torch.Tensor
    """1 on real tokens, 0 on the padding after a packed row's end (long)."""
    position_ids_B_T: torch.Tensor
    """Each token's position inside its own sequence (long); the padding counts as one more sequence."""
    loss_mask_B_T: torch.Tensor
    """The source's loss mask in the packed layout (float32)."""
    old_logprobs_B_T: torch.Tensor
    """The source's old log-probs in the packed layout (float32)."""
    source_B_T: torch.Tensor
    """``row * T_source + t`` of each packed token in the source batch; -1 on padding (long)."""
    rows: tuple[int, ...]
    """The source rows packed here, in packed order."""

    @property
    def seq_len(self) -> int:
        """T' (the packed rows' length)."""
        return int(self.input_ids_B_T.shape[1])

    @property
    def num_tokens(self) -> int:
        """Packed positions (B' × T'), padding included."""
        return int(self.input_ids_B_T.numel())

    def gather(self, x_B_T: torch.Tensor) -> torch.Tensor:
        """A source-layout [B, T] tensor in the packed layout (0 on padding)."""
        flat = x_B_T.reshape(-1)
        src = self.source_B_T
        vals = flat.index_select(0, src.clamp(min=0).reshape(-1)).view(src.shape)
        return torch.where(src >= 0, vals, torch.zeros((), dtype=vals.dtype, device=vals.device))

    def scatter(self, values_B_T: torch.Tensor, out_B_T: torch.Tensor) -> None:
        """Write packed-layout values into the source-layout ``out_B_T`` in place (padding is skipped)."""
        keep = self.source_B_T.reshape(-1) >= 0
        src = self.source_B_T.reshape(-1)[keep]
        out_B_T.view(-1).index_copy_(0, src, values_B_T.reshape(-1)[keep].to(out_B_T.dtype))


def pack_rows(batch: TokenBatch, packed_rows: Sequence[Sequence[int]]) -> PackedBatch:
    """Pack ``batch``: each inner list of source rows becomes one packed row (its sequences end to end, in
    that order); all packed rows are right-padded to the longest. Rows keep their real tokens only."""
    if not packed_rows or any(not r for r in packed_rows):
        raise ConfigError("pack_rows needs at least one packed row, each with at least one source row")
    dev = batch.input_ids_B_T.device
    T_src = batch.seq_len
    lengths = batch.lengths_B.tolist()
    fill = [sum(int(lengths[i]) for i in r) for r in packed_rows]
    T = max(max(fill), 1)
    src = torch.full((len(packed_rows), T), -1, dtype=torch.long)
    pos = torch.zeros((len(packed_rows), T), dtype=torch.long)
    for k, r in enumerate(packed_rows):
        at = 0
        for i in r:
            n = int(lengths[i])
            src[k, at : at + n] = torch.arange(i * T_src, i * T_src + n)
            pos[k, at : at + n] = torch.arange(n)
            at += n
        pos[k, at:] = torch.arange(T - at)
    src = src.to(dev)
    pos = pos.to(dev)
    real = src >= 0
    flat_src = src.clamp(min=0).reshape(-1)

    def take(x: torch.Tensor) -> torch.Tensor:
        vals = x.reshape(-1).index_select(0, flat_src).view(src.shape)
        return torch.where(real, vals, torch.zeros((), dtype=vals.dtype, device=dev))

    return PackedBatch(
        input_ids_B_T=take(batch.input_ids_B_T),
        attention_mask_B_T=real.long(),
        position_ids_B_T=pos,
        loss_mask_B_T=take(batch.loss_mask_B_T),
        old_logprobs_B_T=take(batch.old_logprobs_B_T),
        source_B_T=src,
        rows=tuple(int(i) for r in packed_rows for i in r),
    )
