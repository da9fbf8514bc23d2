"""The :class:`Learner`: owns the policy model and its optimizer, scores batches, takes steps.

Batches are split into micro-batches balanced by token count; HF causal LMs get their sequences packed end to
end in rows without padding (:func:`plan_packed_micro_batches`, :func:`agentrl.batch.pack_rows`), other
models right-padded rows of similar length (:func:`plan_micro_batches`). The loss
normalisers are global over the batch and over ranks, so neither micro-batching nor data parallelism changes
the gradient.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from agentrl.batch import PackedBatch, TokenBatch, pack_rows
from agentrl.errors import ConfigError
from agentrl.heap import trim_heap
from agentrl.learner.aggregation import aggregation_weights, episode_counts
from agentrl.learner.attention import attention_in_effect, one_row_per_micro_batch, resolve_attention
from agentrl.learner.checkpointing import (
    ActivationCost,
    available_bytes,
    checkpointing_switch,
    measure_activation_cost,
    needs_checkpointing,
)
from agentrl.learner.config import LearnerConfig, LearnerStats
from agentrl.learner.distributed import all_reduce_floats, world_size
from agentrl.learner.forward import ForwardOutput, forward_logprobs, packing_support
from agentrl.learner.losses import kl_k3, policy_loss
from agentrl.learner.optim_step import UpdateStats, measured_step
from agentrl.learner.sizing import CPU_SAVED_TOKENS, LearnerSizes, ModelShape, device_sizes

log = logging.getLogger(__name__)
_TOLD_NO_PACKING: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_SIZES: weakref.WeakKeyDictionary[Learner, LearnerSizes] = weakref.WeakKeyDictionary()
_ATTENTION: weakref.WeakKeyDictionary[Learner, tuple[str, str | None]] = weakref.WeakKeyDictionary()
_COST: weakref.WeakKeyDictionary[Learner, ActivationCost | None] = weakref.WeakKeyDictionary()

__all__ = ["PACKED_ROW_TOKENS", "Learner", "plan_micro_batches", "plan_packed_micro_batches"]

# Optimizers that update each element from its own gradient and state alone, so a step may be taken in slices
# of parameters (agentrl.learner.optim_step).
_ELEMENTWISE = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adagrad,
    torch.optim.Adamax,
    torch.optim.RMSprop,
    torch.optim.NAdam,
    torch.optim.RAdam,
)


def plan_micro_batches(lengths: Sequence[int], budget: int | None) -> list[list[int]]:
    """Split rows into micro-batches of at most ``budget`` padded tokens (rows × longest row).

    Rows are taken longest first, so each micro-batch holds rows of similar length (little padding)
    and the token count per micro-batch is balanced up to one row. ``budget=None`` → one
    micro-batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: -int(lengths[i]))
    if budget is None:
        return [order] if order else []
    plans: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        ln = max(int(lengths[i]), 1)
        new_max = max(cur_max, ln)
        if cur and new_max * (len(cur) + 1) > budget:
            plans.append(cur)
            cur, new_max = [], ln
        cur.append(i)
        cur_max = new_max
    if cur:
        plans.append(cur)
    return plans


PACKED_ROW_TOKENS = 2048
"""Packed rows are up to max(the batch's longest sequence, this) tokens long (and at most the micro-batch
budget). SDPA and eager attention compute a packed row's whole [T, T] score matrix (the mask only hides
the other sequences), so a row much longer than the longest sequence costs attention work that right-padded
rows of similar length would not; with rows as long as the longest sequence the attention work per token
stays that of padded micro-batches while the padding falls (32 rows of 256–4,096 tokens in 17 k-token
micro-batches: 3 % instead of 11 %)."""


def _balanced(rows: list[int], lengths: Sequence[int], k: int) -> list[list[int]]:
    """``rows`` in ``k`` packed rows of near-equal fill (longest first into the emptiest)."""
    bins: list[list[int]] = [[] for _ in range(k)]
    fills = [0] * k
    for i in sorted(rows, key=lambda i: -int(lengths[i])):
        j = min(range(k), key=fills.__getitem__)
        bins[j].append(i)
        fills[j] += int(lengths[i])
    return [b for b in bins if b]


def plan_packed_micro_batches(
    lengths: Sequence[int], budget: int | None, row_tokens: int | None = None, *, one_row: bool = False
) -> list[list[list[int]]]:
    """Split rows into micro-batches of packed rows: each micro-batch is a list of packed rows, each the list
    of source rows laid end to end in it, with at most ``budget`` tokens per micro-batch (packed rows ×
    the longest packed row; None = one micro-batch).

    Rows go longest first into the first packed row with room (at most ``min(budget, row_tokens)`` tokens,
    ``row_tokens`` by default max(longest sequence, :data:`PACKED_ROW_TOKENS`); a longer sequence gets a row
    and a micro-batch of its own); packed rows of similar fill form a
    micro-batch, whose rows are then rebalanced when that shortens its longest one. The only padding left
    is after each packed row's end, up to the micro-batch's longest packed row.

    ``one_row``: every micro-batch is a single packed row of up to ``budget`` tokens (``row_tokens`` by
    default the budget, or the whole batch), no padding at all; for the attention kernels that keep packed
    sequences apart at no extra cost (FlashAttention's varlen path needs it: transformers finds packed
    sequences only in a batch of one row; flex_attention's block mask skips the blocks between sequences).
    """
    if one_row:
        if row_tokens is None:
            row_tokens = budget if budget is not None else max(sum(int(n) for n in lengths), 1)
        grouped = plan_packed_micro_batches(lengths, budget, row_tokens)
        return [[row] for mb in grouped for row in mb]
    if row_tokens is None:
        row_tokens = max([PACKED_ROW_TOKENS, *(int(n) for n in lengths)])
    if row_tokens < 1:
        raise ConfigError(f"row_tokens must be >= 1, got {row_tokens}")
    cap = row_tokens if budget is None else min(budget, row_tokens)
    bins: list[list[int]] = []
    fills: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -int(lengths[i])):
        ln = int(lengths[i])
        for j, f in enumerate(fills):
            if f + ln <= cap:
                bins[j].append(i)
                fills[j] += ln
                break
        else:
            bins.append([i])
            fills.append(ln)
    plans: list[list[list[int]]] = []
    for group in plan_micro_batches(fills, budget):
        mb = [bins[j] for j in group]
        alt = _balanced([i for b in mb for i in b], lengths, len(mb))

        def longest(rows: list[list[int]]) -> int:
            return max(sum(int(lengths[i]) for i in b) for b in rows)

        plans.append(alt if len(alt) == len(mb) and longest(alt) < longest(mb) else mb)
    return plans


class Learner:
    """Owns a policy model and its optimizer; scores batches and takes policy-gradient steps.

    Works for any ``nn.Module`` causal LM (HF ``*ForCausalLM`` gets the chunked LM-head path), on
    any device, alone or wrapped with :func:`wrap_fsdp` under ``torch.distributed`` (then every rank
    calls ``step`` with its own shard of the batch; normalisers are reduced over ranks).

    PPO ratios are taken against ``batch.old_logprobs_B_T``: the sampler's log-probs after
    :func:`collate`, or the trainer's own from :meth:`score` after ``dataclasses.replace`` (what verl
    does; it keeps sampler/trainer mismatch out of the ratio).
    """

    def __init__(
        self,
        model: nn.Module,
        config: LearnerConfig | None = None,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        ref_model: nn.Module | None = None,
    ) -> None:
        self.model = model
        self.config = config or LearnerConfig()
        self.ref_model = ref_model
        self._updates_finished = False
        if ref_model is not None:
            ref_model.requires_grad_(False)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError("the model has no trainable parameters")
        self.optimizer = optimizer or torch.optim.AdamW(
            params, lr=self.config.lr, weight_decay=self.config.weight_decay
        )
        if self.config.checkpointing == "on" and checkpointing_switch(self.model) is None:
            raise ConfigError("gradient_checkpointing on needs an HF model (activation_checkpointing_enable)")
        self._attention()  # an attention implementation that cannot run here fails now, not mid-step

    # ---------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where the model's parameters live (batches are moved there)."""
        return next(self.model.parameters()).device

    def _autocast(self) -> AbstractContextManager[Any]:
        if not self.config.bf16_autocast:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    @contextmanager
    def _recompute(self, over_budget: bool) -> Iterator[bool]:
        """Activation checkpointing for one micro-batch's forward and backward: always with
        ``gradient_checkpointing`` on, else for a micro-batch over ``micro_batch_tokens`` (or, under ``auto``,
        one that would not fit: :meth:`_would_not_fit`). It is switched on only here, so a sampler that shares
        the model (and its KV cache) never generates with it. Yields whether it is on."""
        on = over_budget or self.config.checkpointing == "on"
        switch = checkpointing_switch(self.model) if on else None
        if switch is None:
            yield False
            return
        enable, disable = switch
        enable()
        try:
            yield True
        finally:
            disable()

    def _would_not_fit(self, tokens: int) -> bool:
        """``auto`` checkpointing: whether a micro-batch of ``tokens`` tokens would not fit the CUDA device's
        memory without it, from the activation cost measured once per learner (two probe passes, discarded;
        :func:`measure_activation_cost`). False off CUDA, for other modes, or without HF checkpointing."""
        if self.config.checkpointing != "auto" or self.device.type != "cuda":
            return False
        if self not in _COST:
            _COST[self] = None
            vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
            if checkpointing_switch(self.model) is not None and isinstance(vocab, int):
                _COST[self] = measure_activation_cost(lambda n: self._probe_pass(n, vocab), self.device)
                self.optimizer.zero_grad(set_to_none=True)
                log.info("learner activation cost (auto checkpointing): %s", _COST[self])
        cost = _COST[self]
        return cost is not None and needs_checkpointing(tokens, cost, available_bytes(self.device))

    def _probe_pass(self, tokens: int, vocab: int) -> None:
        """One update-shaped forward and backward over a random ``tokens``-token row (its gradient is
        discarded by the caller), without checkpointing."""
        ids = torch.randint(vocab, (1, tokens), device=self.device)
        with self._attending(self.model), self._autocast():
            out = forward_logprobs(
                self.model, ids, torch.ones_like(ids), chunk_size=self._chunk(), with_entropy=True
            )
            assert out.entropy_B_T is not None
            ((out.logprobs_B_T + out.entropy_B_T).sum() * 0.0).backward()

    def _attention(self) -> str | None:
        """The attention implementation of the learner's passes (None: the model's own), resolved once per
        setting (:func:`resolve_attention`; ``auto`` off CUDA keeps the model's own)."""
        want = self.config.attention
        got = _ATTENTION.get(self)
        if got is None or got[0] != want:
            impl: str | None = resolve_attention(want, self.device.type)
            if want == "auto" and self.device.type != "cuda":
                impl = None
            got = (want, impl)
            _ATTENTION[self] = got
            log.info("learner attention: %s (asked: %s)", impl or "the model's own", want)
        return got[1]

    def _attending(self, model: nn.Module) -> AbstractContextManager[None]:
        """The learner's attention implementation on ``model`` for one pass (restored after it)."""
        return attention_in_effect(model, self._attention())

    def _packs(self, model: nn.Module) -> bool:
        """Whether ``model``'s micro-batches are packed rows (``pack_sequences`` and a model that can)."""
        if not self.config.pack_sequences:
            return False
        why = packing_support(model, self._attention())
        if why is not None and model not in _TOLD_NO_PACKING:
            _TOLD_NO_PACKING.add(model)
            log.warning("the learner pads rows instead of packing them: %s", why)
        return why is None

    def _device_sizes(self) -> LearnerSizes:
        """The sizes for this device, for config fields left at 0 (chosen once, on first use)."""
        got = _SIZES.get(self)
        if got is None:
            shape = None
            if self.device.type == "cuda":
                cfg = getattr(self.model, "config", None)
                if cfg is None:
                    raise ConfigError(
                        "micro_batch_tokens or chunk_size 0 on CUDA needs an HF model (its config)"
                    )
                shape = ModelShape.from_config(cfg)
            free = None
            if self.device.type == "cuda":
                # The weights are loaded already; the sizing subtracts them (and their gradients and moments).
                free = torch.cuda.mem_get_info(self.device)[0] + sum(
                    p.numel() * p.element_size() for p in self.model.parameters()
                )
            got = device_sizes(self.device, shape, free_bytes=free)
            _SIZES[self] = got
            log.info(
                "learner sizes: micro_batch_tokens=%d chunk_size=%d (%s)",
                got.micro_batch_tokens,
                got.chunk_size,
                got.why,
            )
        return got

    def _budget(self) -> int | None:
        """Tokens per micro-batch (None: the whole batch)."""
        b = self.config.micro_batch_tokens
        return self._device_sizes().micro_batch_tokens if b == 0 else b

    def _chunk(self) -> int:
        return self.config.chunk_size or self._device_sizes().chunk_size

    def _micro(self, batch: TokenBatch, model: nn.Module) -> list[list[list[int]]]:
        """Micro-batches as lists of rows to lay out, each a list of source rows (one per row unpacked)."""
        lengths = batch.lengths_B.tolist()
        if self._packs(model):
            one_row = one_row_per_micro_batch(self._attention())
            return plan_packed_micro_batches(lengths, self._budget(), one_row=one_row)
        return [[[i] for i in rows] for rows in plan_micro_batches(lengths, self._budget())]

    def _saved_tokens(self) -> int:
        """Scored tokens per micro-batch whose LM-head chunks keep their log-softmax for backward instead of
        being checkpointed (:func:`forward_logprobs`): on CPU
        :data:`~agentrl.learner.sizing.CPU_SAVED_TOKENS`, on other devices none (their chunk is sized from
        the free memory for checkpointed chunks)."""
        return CPU_SAVED_TOKENS if self.device.type == "cpu" else 0

    def _forward(
        self, model: nn.Module, mb: PackedBatch, *, spi2: bool, entropy: bool, entropy_grad: bool = False
    ) -> ForwardOutput:
        packed = self._packs(model)
        with self._autocast():
            return forward_logprobs(
                model,
                mb.input_ids_B_T,
                mb.attention_mask_B_T,
                temperature=self.config.temperature,
                chunk_size=self._chunk(),
                with_sum_pi_squared=spi2,
                with_entropy=entropy,
                token_mask_B_T=mb.loss_mask_B_T,
                position_ids_B_T=mb.position_ids_B_T if packed else None,
                entropy_grad=entropy_grad,
                saved_tokens=self._saved_tokens() if torch.is_grad_enabled() else 0,
            )

    def _synced_plans(self, batch: TokenBatch, model: nn.Module) -> list[tuple[list[list[int]], bool]]:
        """Micro-batches as (rows laid out, is_dummy). Under torch.distributed every rank must make the same
        number of forward (and backward) calls, since each one runs FSDP collectives; ranks with
        fewer micro-batches pad with dummy passes over their first row, whose results are
        discarded."""
        plans = self._micro(batch, model)
        if not plans:
            raise ConfigError("the batch has no rows")
        n = len(plans)
        if world_size() > 1:
            (n_max,) = all_reduce_floats([float(n)], dist.ReduceOp.MAX, self.device)
            n = int(n_max)
        return [(plans[k], False) if k < len(plans) else ([plans[0][0][:1]], True) for k in range(n)]

    def _score_with(
        self, model: nn.Module, batch: TokenBatch, spi2: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = batch.to(self.device)
        B, T = batch.input_ids_B_T.shape
        lp = torch.zeros(B, T, dtype=torch.float32, device=self.device)
        sp = torch.zeros(B, T, dtype=torch.float32, device=self.device)
        plans = self._synced_plans(batch, model)
        was_training = model.training
        model.eval()  # deterministic scores (no dropout)
        try:
            with torch.no_grad(), self._attending(model):
                for rows, dummy in plans:
                    mb = pack_rows(batch, rows)
                    out = self._forward(model, mb, spi2=spi2, entropy=False)
                    if dummy:
                        continue
                    mb.scatter(out.logprobs_B_T.float(), lp)
                    if out.sum_pi_squared_B_T is not None:
                        mb.scatter(out.sum_pi_squared_B_T.float(), sp)
        finally:
            model.train(was_training)
        return lp, sp

    def score(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs, Σπ²) of the current policy on the batch's model tokens, [B, T] float32, no
        grad, 0 where the loss mask is 0. Feed both to :func:`agentrl.credit.compute_advantages`."""
        lp, sp = self._score_with(self.model, batch, spi2=True)
        return lp, sp

    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """Log-probs of the reference model on the model tokens ([B, T], no grad)."""
        if self.ref_model is None:
            raise ConfigError("no ref_model was given to the Learner")
        lp, _ = self._score_with(self.ref_model, batch, spi2=False)
        return lp

    def release_optimizer_state(self) -> None:
        """No update follows (the run's last checkpoint holds the optimizer's state): free the optimizer's
        moments, twice the weights' memory under AdamW, so what runs next (the trained held-out
        evaluation) does not peak on top of them. A later :meth:`step` is refused: it would restart the
        moments at zero."""
        self.optimizer.state.clear()
        self._updates_finished = True

    # ---------------------------------------------------------------------------------------------
    def step(
        self,
        batch: TokenBatch,
        advantages_B_T: torch.Tensor,
        *,
        ref_logprobs_B_T: torch.Tensor | None = None,
    ) -> LearnerStats:
        """One optimizer step on ``batch`` with the given advantages (gradient accumulated over
        micro-batches balanced by token count; normalisers global over the batch and all ranks)."""
        if self._updates_finished:
            raise ConfigError(
                "this Learner released its optimizer state (release_optimizer_state): no more steps"
            )
        cfg = self.config
        dev = self.device
        batch = batch.to(dev)
        B, T = batch.input_ids_B_T.shape
        if advantages_B_T.shape != (B, T):
            raise ConfigError(f"advantages have shape {tuple(advantages_B_T.shape)}, batch is {(B, T)}")
        adv = advantages_B_T.to(dev, torch.float32)
        if bool((~torch.isfinite(adv) & (batch.loss_mask_B_T != 0)).any()):
            raise ConfigError("advantages are not finite on some model tokens")
        if cfg.kl_coef > 0 and ref_logprobs_B_T is None:
            if self.ref_model is None:
                raise ConfigError("kl_coef > 0 needs a ref_model or ref_logprobs_B_T")
            ref_logprobs_B_T = self.reference_logprobs(batch)
        ref = None if ref_logprobs_B_T is None else ref_logprobs_B_T.to(dev, torch.float32)

        mask = batch.loss_mask_B_T.float()
        seq_tokens = mask.sum(dim=1)
        n_tok_local = float(seq_tokens.sum())
        n_seq_local = float((seq_tokens > 0).sum())
        world = world_size()
        red_sum = dist.ReduceOp.SUM if world > 1 else None
        ep_tokens, n_ep_local = episode_counts(seq_tokens, batch.episode_ids_or_none)
        n_tok, n_seq, n_ep = all_reduce_floats([n_tok_local, n_seq_local, n_ep_local], red_sum, dev)
        plans = self._synced_plans(batch, self.model)
        # Per-token weights implementing the aggregation with global normalisers; ×world because the
        # data-parallel wrapper averages gradients over ranks.
        weight = aggregation_weights(
            mask, cfg.loss_agg, n_tokens=n_tok, n_sequences=n_seq, n_episodes=n_ep, episode_tokens_B=ep_tokens
        )
        weight = weight * world

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = dict.fromkeys(("loss", "pg", "kl", "ent", "clip", "akl"), 0.0)
        ratio_max = 0.0
        recomputed = 0
        budget = self._budget()
        for rows, dummy in plans:
            mb = pack_rows(batch, rows)
            w_mb = mb.gather(weight)
            # The fit check first: its one-time probe must run on every rank (FSDP collectives).
            over = self._would_not_fit(mb.num_tokens) or (budget is not None and mb.num_tokens > budget)
            with self._attending(self.model), self._recompute(over) as rc:
                recomputed += rc and cfg.checkpointing != "on"
                loss, pg, clipped, kl, ent, lp = self._micro_loss(
                    mb, w_mb, mb.gather(adv), None if ref is None else mb.gather(ref), dummy
                )
                loss.backward()
            # Autograd's small allocations of this micro-batch are freed now but stay resident in the heaps;
            # the next micro-batch's activations would peak on top of them.
            trim_heap()
            if dummy:
                continue
            m = mb.loss_mask_B_T
            with torch.no_grad():
                sums["loss"] += float(loss) / world
                sums["pg"] += float((torch.where(m != 0, pg, 0.0) * w_mb).sum()) / world
                sums["kl"] += float((kl * m).sum())
                sums["ent"] += float((ent * m).sum())
                sums["clip"] += float((clipped * m).sum())
                sums["akl"] += float(((mb.old_logprobs_B_T - lp) * m).sum())
                if bool((m != 0).any()):
                    r = torch.exp((lp - mb.old_logprobs_B_T).clamp(-20, 20))[m != 0]
                    ratio_max = max(ratio_max, float(r.max()))

        grad_norm = self._clip_grad()
        skipped = cfg.skip_nonfinite_grad and not math.isfinite(grad_norm)
        upd = UpdateStats(math.nan, math.nan)
        if not skipped:
            upd = self._optimizer_step()
        self.optimizer.zero_grad(set_to_none=True)
        tot = all_reduce_floats(
            [sums["loss"], sums["pg"], sums["kl"], sums["ent"], sums["clip"], sums["akl"]],
            red_sum,
            dev,
        )
        denom = max(n_tok, 1.0)
        return LearnerStats(
            loss=tot[0],
            pg_loss=tot[1],
            kl=tot[2] / denom,
            entropy=tot[3] / denom,
            grad_norm=grad_norm,
            clip_frac=tot[4] / denom,
            approx_kl=tot[5] / denom,
            ratio_max=ratio_max,
            tokens=int(n_tok_local),
            sequences=int(n_seq_local),
            micro_batches=len(plans),
            skipped=skipped,
            recomputed_micro_batches=recomputed,
            update_rel_norm=upd.rel_norm,
            unchanged_frac=upd.unchanged_frac,
        )

    def _optimizer_step(self) -> UpdateStats:
        """The optimizer's step, measured (:func:`measured_step`): sliced for the element-wise optimizers
        of ``torch.optim``, whole (with one full copy of the weights) for any other."""
        if not self.config.measure_update:
            self.optimizer.step()
            return UpdateStats(math.nan, math.nan)
        elementwise = isinstance(self.optimizer, _ELEMENTWISE)
        return measured_step(self.optimizer, slice_elems=(1 << 25) if elementwise else None)

    def _micro_loss(
        self,
        mb: PackedBatch,
        w: torch.Tensor,
        a: torch.Tensor,
        ref: torch.Tensor | None,
        dummy: bool,
    ) -> tuple[torch.Tensor, ...]:
        """One micro-batch's forward: (loss to differentiate, pg, clipped, kl, entropy, log π), per token of
        its layout (``w``, ``a`` and ``ref`` already in it)."""
        cfg = self.config
        w = w * (0.0 if dummy else 1.0)
        m = mb.loss_mask_B_T
        # The entropy is differentiated only when it is in the loss; otherwise it is a metric (no backward).
        out = self._forward(self.model, mb, spi2=False, entropy=True, entropy_grad=cfg.entropy_coef > 0)
        lp = out.logprobs_B_T
        assert out.entropy_B_T is not None
        ent = out.entropy_B_T
        pg, clipped = policy_loss(
            lp,
            mb.old_logprobs_B_T,
            torch.where(m != 0, a, torch.zeros_like(a)),
            kind=cfg.policy_loss,
            clip_eps_low=cfg.clip_eps_low,
            clip_eps_high=cfg.clip_eps_high,
            dual_clip_c=cfg.dual_clip_c,
        )
        per_tok = pg
        kl = torch.zeros_like(lp)
        if ref is not None:
            kl = kl_k3(lp, ref)
            if cfg.kl_coef > 0:
                per_tok = per_tok + cfg.kl_coef * kl
        if cfg.entropy_coef > 0:
            per_tok = per_tok - cfg.entropy_coef * ent
        per_tok = torch.where(m != 0, per_tok, torch.zeros_like(per_tok))
        return (per_tok * w).sum(), pg, clipped, kl, ent, lp

    def _clip_grad(self) -> float:
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else math.inf
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip_fn = getattr(self.model, "clip_grad_norm_", None)  # FSDP1 has its own
        if clip_fn is not None:
            norm = clip_fn(max_norm)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=None)
        full = getattr(norm, "full_tensor", None)  # FSDP2: a DTensor
        if callable(full):
            norm = full()
        return float(norm)
