"""The policy-gradient learner: chunked log-prob/Σπ² forward pass, REINFORCE and PPO-clip losses.

Data flow for one training step (the trainer in ``agentrl.trainers`` drives it)::

    batch = collate(trajectories, pad_id)                     # agentrl.batch
    logprobs, sum_pi_sq = learner.score(batch)                # no grad, trainer's own π_old and Σπ²
    batch = dataclasses.replace(batch, old_logprobs_B_T=logprobs)
    adv = compute_advantages("otb", batch.token_rewards_B_T, batch.loss_mask_B_T,
                             logprobs, sum_pi_sq, batch.group_ids)
    stats = learner.step(batch, adv)

Memory: the vocabulary projection is applied to the final hidden states ``chunk_size`` tokens at a
time and only where a value is needed (model tokens), so no [T, V] fp32 tensor exists; with
gradients each chunk is checkpointed (its logits are recomputed in backward), keeping the extra
memory O(chunk_size × V).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from agentrl.batch import TokenBatch, collate
from agentrl.errors import ConfigError

__all__ = [
    "ForwardOutput",
    "Learner",
    "LearnerConfig",
    "LearnerStats",
    "TokenBatch",
    "collate",
    "forward_logprobs",
    "plan_micro_batches",
    "policy_loss",
    "wrap_fsdp",
]

PolicyLossName = Literal["ppo", "reinforce"]
LossAgg = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
_LOSS_AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


# ------------------------------------------------------------------------------------------------
# Forward pass: log-probs, Σπ² and entropy from the final hidden states, chunked over tokens
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ForwardOutput:
    """Per-token results of :func:`forward_logprobs`, all [B, T] float32 (0 where not computed)."""

    logprobs_B_T: torch.Tensor
    """log π(input_ids[:, t] | input_ids[:, :t]); 0 at t = 0 and at positions not computed."""
    sum_pi_squared_B_T: torch.Tensor | None
    """Σ_v π(v)² of the distribution that produced token t (no grad); None unless requested."""
    entropy_B_T: torch.Tensor | None
    """Entropy of that distribution (differentiable); None unless requested."""


def _head_parts(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """(decoder, output head) of an HF causal LM, or None for models that only return logits."""
    get_dec = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    if get_dec is None or get_head is None:
        return None
    try:
        dec, head = get_dec(), get_head()
    except (AttributeError, NotImplementedError):
        return None
    if not isinstance(dec, nn.Module) or not isinstance(head, nn.Module) or dec is model:
        return None
    return dec, head


def _logit_transform(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """What HF applies after the LM head: Cohere-style ``logit_scale``, Gemma-style final
    softcapping."""
    cfg = getattr(model, "config", None)
    scale = getattr(cfg, "logit_scale", None)
    cap = getattr(cfg, "final_logit_softcapping", None)

    def f(z: torch.Tensor) -> torch.Tensor:
        if isinstance(scale, int | float) and scale != 1:
            z = z * scale
        if isinstance(cap, int | float) and cap > 0:
            z = torch.tanh(z / cap) * cap
        return z

    return f


def _run_backbone(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """Final hidden states [B, T, H] and a function hidden → logits, or logits [B, T, V] and
    identity.

    The model itself is called (not its decoder), so wrappers' hooks (FSDP unshard/reshard, hooks of
    accelerate) run; the decoder's output is captured with a forward hook, and the head is asked for
    one position only (``logits_to_keep=1``) so the full [B, T, V] logits are never built.
    """
    params = inspect.signature(model.forward).parameters
    kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
    if "use_cache" in params:
        kwargs["use_cache"] = False
    parts = _head_parts(model)
    keep = "logits_to_keep" if "logits_to_keep" in params else None
    if keep is None and "num_logits_to_keep" in params:
        keep = "num_logits_to_keep"
    if parts is None or keep is None:
        out = model(**kwargs)
        logits = out.logits if hasattr(out, "logits") else out
        return logits, lambda z: z
    dec, head = parts
    captured: list[torch.Tensor] = []

    def hook(_mod: nn.Module, _inp: Any, out: Any) -> None:
        h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        captured.append(h)

    handle = dec.register_forward_hook(hook)
    try:
        out = model(**kwargs, **{keep: 1})
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"expected one decoder call, saw {len(captured)}")
    hidden = captured[0]
    if torch.is_grad_enabled() and hidden.requires_grad:
        # Tie the model's real output into the graph (with weight 0) so wrappers that hook the
        # root's
        # outputs (FSDP pre-backward) see the backward pass.
        logits = out.logits if hasattr(out, "logits") else out[0]
        hidden = hidden + 0.0 * logits.reshape(-1)[0].to(hidden.dtype)
    post = _logit_transform(model)
    return hidden, lambda h: post(head(h))


def _chunk_stats(
    h: torch.Tensor,
    targets: torch.Tensor,
    to_logits: Callable[[torch.Tensor], torch.Tensor],
    temperature: float,
    want_spi2: bool,
    want_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log π(target), Σπ² (detached) and entropy for one chunk of hidden states (or logits)."""
    z = to_logits(h)
    z = z.to(torch.float64 if z.dtype == torch.float64 else torch.float32)
    if temperature != 1.0:
        z = z / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    del z  # the chunk's logits are not needed any more; free them before the next [C, V] buffer
    lp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    empty = lp.new_zeros(0)
    spi2 = empty
    ent = empty
    if not torch.is_grad_enabled():
        # Scoring: reuse the log-softmax buffer in place (one [C, V] fp32 buffer per chunk).
        if want_entropy:
            ent = -(logp_all.exp() * logp_all).sum(dim=-1)
        if want_spi2:
            spi2 = logp_all.exp_().square_().sum(dim=-1)
    elif want_spi2 or want_entropy:
        p = logp_all.exp()
        if want_spi2:
            with torch.no_grad():
                spi2 = p.detach().square().sum(dim=-1)
        if want_entropy:
            ent = -(p * logp_all).sum(dim=-1)
    return lp, spi2, ent


def forward_logprobs(
    model: nn.Module,
    input_ids_B_T: torch.Tensor,
    attention_mask_B_T: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_sum_pi_squared: bool = True,
    with_entropy: bool = False,
    token_mask_B_T: torch.Tensor | None = None,
) -> ForwardOutput:
    """One forward pass → per-token log-probs of the next token (and Σπ², entropy), chunked over
    tokens.

    ``logprobs[:, t] = log π(input_ids[:, t] | input_ids[:, :t])`` with π = softmax(logits /
    temperature); column 0 is 0. Values are computed at positions t ≥ 1 with ``attention_mask[:, t]
    = 1`` (and ``token_mask[:, t] = 1`` when given, e.g. the loss mask), 0 elsewhere. Differentiable
    when grad is enabled; Σπ² is always detached.

    For HF causal LMs the final hidden states are projected through ``get_output_embeddings()``
    ``chunk_size`` tokens at a time (extra memory O(chunk_size × V) fp32; with grad each chunk is
    checkpointed). Other models (returning ``.logits`` or a tensor) are called as is; their logits
    are then only upcast chunk by chunk.
    """
    if input_ids_B_T.dim() != 2 or attention_mask_B_T.shape != input_ids_B_T.shape:
        raise ConfigError(
            f"input_ids and attention_mask must both be [B, T], got {tuple(input_ids_B_T.shape)} "
            f"and {tuple(attention_mask_B_T.shape)}"
        )
    if temperature <= 0:
        raise ConfigError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
    B, T = input_ids_B_T.shape
    dev = input_ids_B_T.device
    hidden, to_logits = _run_backbone(model, input_ids_B_T, attention_mask_B_T)
    grad = torch.is_grad_enabled() and hidden.requires_grad

    sel_B_T = attention_mask_B_T[:, 1:] != 0
    if token_mask_B_T is not None:
        if token_mask_B_T.shape != input_ids_B_T.shape:
            raise ConfigError("token_mask must have the shape of input_ids")
        sel_B_T = sel_B_T & (token_mask_B_T[:, 1:] != 0)
    idx = sel_B_T.reshape(-1).nonzero().squeeze(1)
    n = B * (T - 1) if T > 0 else 0
    flat_h = hidden[:, :-1].reshape(n, hidden.shape[-1]).index_select(0, idx)
    flat_tgt = input_ids_B_T[:, 1:].reshape(-1).index_select(0, idx)

    lps, spis, ents = [], [], []
    for s in range(0, int(idx.numel()), chunk_size):
        h, tg = flat_h[s : s + chunk_size], flat_tgt[s : s + chunk_size]
        args = (h, tg, to_logits, temperature, with_sum_pi_squared, with_entropy)
        if grad:
            lp, spi2, ent = checkpoint(_chunk_stats, *args, use_reentrant=False)
        else:
            lp, spi2, ent = _chunk_stats(*args)
        lps.append(lp)
        spis.append(spi2)
        ents.append(ent)

    out_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32

    def place(parts: list[torch.Tensor]) -> torch.Tensor:
        vals = torch.cat(parts) if parts else torch.zeros(0, dtype=out_dtype, device=dev)
        full = torch.zeros(n, dtype=vals.dtype, device=dev).index_copy(0, idx, vals)
        return torch.cat([torch.zeros(B, 1, dtype=vals.dtype, device=dev), full.view(B, T - 1)], 1)

    if T == 0:
        z = torch.zeros(B, 0, dtype=out_dtype, device=dev)
        return ForwardOutput(z, z if with_sum_pi_squared else None, z if with_entropy else None)
    return ForwardOutput(
        logprobs_B_T=place(lps),
        sum_pi_squared_B_T=place(spis) if with_sum_pi_squared else None,
        entropy_B_T=place(ents) if with_entropy else None,
    )


# ------------------------------------------------------------------------------------------------
# Losses
# ------------------------------------------------------------------------------------------------
def policy_loss(
    logprobs_B_T: torch.Tensor,
    old_logprobs_B_T: torch.Tensor,
    advantages_B_T: torch.Tensor,
    *,
    kind: PolicyLossName = "ppo",
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token policy-gradient loss and a per-token "was clipped" indicator (both [B, T],
    unmasked).

    * ``reinforce``: −A·log π (the gradient of the REINFORCE objective; old log-probs unused).
    * ``ppo``: max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)), r = π/π_old; with ``dual_clip_c`` = c >
      1, tokens with A < 0 are additionally bounded by −A·c (dual-clip PPO).
    """
    if kind == "reinforce":
        return -advantages_B_T * logprobs_B_T, torch.zeros_like(logprobs_B_T)
    if kind != "ppo":
        raise ConfigError(f"unknown policy loss {kind!r}; choose 'ppo' or 'reinforce'")
    # Clamp the log-ratio so one stale token cannot overflow exp (the clip makes its gradient 0
    # anyway).
    ratio = torch.exp((logprobs_B_T - old_logprobs_B_T).clamp(-20.0, 20.0))
    pg1 = -advantages_B_T * ratio
    pg2 = -advantages_B_T * ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    pg = torch.maximum(pg1, pg2)
    clipped = (pg2 > pg1).to(pg.dtype)
    if dual_clip_c is not None:
        pg3 = -advantages_B_T * dual_clip_c
        neg = advantages_B_T < 0
        clipped = torch.where(neg & (pg > pg3), torch.ones_like(clipped), clipped)
        pg = torch.where(neg, torch.minimum(pg, pg3), pg)
    return pg, clipped


def _k3(logprobs_B_T: torch.Tensor, ref_logprobs_B_T: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(π ‖ π_ref) per token: e^{Δ} − Δ − 1 with Δ = log π_ref − log π (≥ 0)."""
    d = (ref_logprobs_B_T - logprobs_B_T).clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


# ------------------------------------------------------------------------------------------------
# Config, stats, micro-batching
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LearnerConfig:
    """Settings of :class:`Learner`; validated on construction (:class:`ConfigError`)."""

    policy_loss: PolicyLossName = "ppo"
    """``ppo`` (clipped surrogate) or ``reinforce`` (−A·log π)."""
    clip_eps_low: float = 0.2
    """PPO: lower clip range, ratio ≥ 1 − clip_eps_low."""
    clip_eps_high: float = 0.2
    """PPO: upper clip range, ratio ≤ 1 + clip_eps_high (DAPO's clip-higher uses 0.28)."""
    dual_clip_c: float | None = None
    """PPO dual clip: bound the loss of negative-advantage tokens by −A·c (c > 1, typically 3); None
    = off."""
    loss_agg: LossAgg = "token-mean"
    """``token-mean`` (mean over all model tokens of the batch), ``seq-mean-token-sum`` (mean over
    sequences of the per-sequence sum) or ``seq-mean-token-mean`` (mean over sequences of the
    per-sequence mean). Sequences without model tokens are not counted. Normalisers are global over
    the batch (and over ranks), so micro-batching does not change the gradient."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the reference policy (needs ``ref_model`` or
    ``ref_logprobs``)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this value; None = no clipping (the norm is still
    reported)."""
    micro_batch_tokens: int | None = None
    """Padded tokens (rows × longest row) per micro-batch; rows are packed longest first; None = the
    whole batch at once. A row longer than the budget gets a micro-batch of its own."""
    lr: float = 1e-6
    """Learning rate of the default AdamW (ignored when an optimizer is passed)."""
    weight_decay: float = 0.0
    """Weight decay of the default AdamW."""
    temperature: float = 1.0
    """Sampling temperature: log-probs and Σπ² are those of softmax(logits / temperature)."""
    chunk_size: int = 1024
    """Tokens per chunk through the LM head (extra memory ≈ chunk_size × vocab × 4 bytes × a
    few)."""
    bf16_autocast: bool = False
    """Run forward passes under bf16 autocast (meant for CUDA; works, slowly, on CPU)."""
    gradient_checkpointing: bool = False
    """Enable HF activation checkpointing on the model (less memory, one extra forward)."""
    skip_nonfinite_grad: bool = True
    """Skip the optimizer step (and report ``skipped``) when the gradient norm is NaN or inf."""

    def __post_init__(self) -> None:
        if self.policy_loss not in ("ppo", "reinforce"):
            raise ConfigError(f"policy_loss must be 'ppo' or 'reinforce', got {self.policy_loss!r}")
        if self.loss_agg not in _LOSS_AGGS:
            raise ConfigError(f"loss_agg must be one of {_LOSS_AGGS}, got {self.loss_agg!r}")
        if not (0 <= self.clip_eps_low < 1) or self.clip_eps_high < 0:
            raise ConfigError(
                f"need 0 <= clip_eps_low < 1 and clip_eps_high >= 0, got {self.clip_eps_low}, "
                f"{self.clip_eps_high}"
            )
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            raise ConfigError(f"dual_clip_c must be > 1 (or None), got {self.dual_clip_c}")
        for name in ("kl_coef", "entropy_coef", "lr", "weight_decay"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {v}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ConfigError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise ConfigError(f"micro_batch_tokens must be >= 1 or None, got {self.micro_batch_tokens}")
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if self.chunk_size < 1:
            raise ConfigError(f"chunk_size must be >= 1, got {self.chunk_size}")


@dataclass(frozen=True, slots=True)
class LearnerStats:
    """What one :meth:`Learner.step` did (plain floats, ready to log)."""

    loss: float
    """The aggregated objective that was differentiated (policy + kl_coef·KL − entropy_coef·H)."""
    pg_loss: float
    """Its policy-gradient part alone (same aggregation)."""
    kl: float
    """Token-mean k3 KL to the reference policy (0 when the KL term is off)."""
    entropy: float
    """Token-mean entropy of the current policy on model tokens."""
    grad_norm: float
    """Global gradient norm before clipping."""
    clip_frac: float
    """Fraction of model tokens whose PPO ratio was clipped (0 for REINFORCE)."""
    approx_kl: float
    """Token-mean of log π_old − log π (drift from the behaviour policy, before the update)."""
    ratio_max: float
    """Largest importance ratio π/π_old among model tokens."""
    tokens: int
    """Model tokens in the batch (on this rank)."""
    sequences: int
    """Rows with at least one model token (on this rank)."""
    micro_batches: int
    """Forward/backward passes taken."""
    skipped: bool
    """True when the update was skipped because the gradient was not finite."""

    def to_dict(self, prefix: str = "actor/") -> dict[str, float]:
        """Flat metrics for a logger."""
        return {prefix + k: float(getattr(self, k)) for k in self.__slots__}


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


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _all_reduce(values: list[float], op: Any, device: torch.device) -> list[float]:
    if _world() == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return [float(v) for v in t.tolist()]


# ------------------------------------------------------------------------------------------------
# Learner
# ------------------------------------------------------------------------------------------------
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
        if ref_model is not None:
            ref_model.requires_grad_(False)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError("the model has no trainable parameters")
        self.optimizer = optimizer or torch.optim.AdamW(
            params, lr=self.config.lr, weight_decay=self.config.weight_decay
        )
        if self.config.gradient_checkpointing:
            # transformers >= 5 renamed the switch; accept both spellings.
            new = getattr(model, "activation_checkpointing_enable", None)
            old = getattr(model, "gradient_checkpointing_enable", None)
            if new is not None:
                new(activation_checkpointing_kwargs={"use_reentrant": False})
            elif old is not None:
                old(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                raise ConfigError(
                    "gradient_checkpointing needs an HF model (activation_checkpointing_enable)"
                )

    # ---------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where the model's parameters live (batches are moved there)."""
        return next(self.model.parameters()).device

    def _autocast(self) -> AbstractContextManager[Any]:
        if not self.config.bf16_autocast:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def _micro(self, batch: TokenBatch) -> list[list[int]]:
        return plan_micro_batches(batch.lengths_B.tolist(), self.config.micro_batch_tokens)

    def _forward(self, model: nn.Module, mb: TokenBatch, *, spi2: bool, entropy: bool) -> ForwardOutput:
        with self._autocast():
            return forward_logprobs(
                model,
                mb.input_ids_B_T,
                mb.attention_mask_B_T,
                temperature=self.config.temperature,
                chunk_size=self.config.chunk_size,
                with_sum_pi_squared=spi2,
                with_entropy=entropy,
                token_mask_B_T=mb.loss_mask_B_T,
            )

    def _synced_plans(self, batch: TokenBatch) -> list[tuple[list[int], bool]]:
        """Micro-batches as (rows, is_dummy). Under torch.distributed every rank must make the same
        number of forward (and backward) calls, since each one runs FSDP collectives; ranks with
        fewer micro-batches pad with dummy passes over their first row, whose results are
        discarded."""
        plans = self._micro(batch)
        if not plans:
            raise ConfigError("the batch has no rows")
        n = len(plans)
        if _world() > 1:
            (n_max,) = _all_reduce([float(n)], dist.ReduceOp.MAX, self.device)
            n = int(n_max)
        return [(plans[k], False) if k < len(plans) else (plans[0][:1], True) for k in range(n)]

    def _score_with(
        self, model: nn.Module, batch: TokenBatch, spi2: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = batch.to(self.device)
        B, T = batch.input_ids_B_T.shape
        lp = torch.zeros(B, T, dtype=torch.float32, device=self.device)
        sp = torch.zeros(B, T, dtype=torch.float32, device=self.device)
        was_training = model.training
        model.eval()  # deterministic scores (no dropout)
        try:
            with torch.no_grad():
                for rows, dummy in self._synced_plans(batch):
                    mb = batch.select(rows)
                    out = self._forward(model, mb, spi2=spi2, entropy=False)
                    if dummy:
                        continue
                    t = mb.seq_len
                    idx = torch.as_tensor(rows, device=self.device)
                    lp[idx, :t] = out.logprobs_B_T.float()
                    if out.sum_pi_squared_B_T is not None:
                        sp[idx, :t] = out.sum_pi_squared_B_T.float()
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
        world = _world()
        red_sum = dist.ReduceOp.SUM if world > 1 else None
        n_tok, n_seq = _all_reduce([n_tok_local, n_seq_local], red_sum, dev)
        plans = self._synced_plans(batch)
        # Per-token weights implementing the aggregation with global normalisers; ×world because the
        # data-parallel wrapper averages gradients over ranks.
        if cfg.loss_agg == "token-mean":
            weight = mask / max(n_tok, 1.0)
        elif cfg.loss_agg == "seq-mean-token-sum":
            weight = mask / max(n_seq, 1.0)
        else:
            weight = mask / (seq_tokens.clamp(min=1.0)[:, None] * max(n_seq, 1.0))
        weight = weight * world

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = dict.fromkeys(("loss", "pg", "kl", "ent", "clip", "akl"), 0.0)
        ratio_max = 0.0
        for rows, dummy in plans:
            mb = batch.select(rows)
            idx = torch.as_tensor(rows, device=dev)
            t = mb.seq_len
            w = weight[idx, :t] * (0.0 if dummy else 1.0)
            m = mb.loss_mask_B_T
            a = adv[idx, :t]
            out = self._forward(self.model, mb, spi2=False, entropy=True)
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
                kl = _k3(lp, ref[idx, :t])
                if cfg.kl_coef > 0:
                    per_tok = per_tok + cfg.kl_coef * kl
            if cfg.entropy_coef > 0:
                per_tok = per_tok - cfg.entropy_coef * ent
            per_tok = torch.where(m != 0, per_tok, torch.zeros_like(per_tok))
            loss = (per_tok * w).sum()
            loss.backward()
            if dummy:
                continue
            with torch.no_grad():
                sums["loss"] += float(loss) / world
                sums["pg"] += float((torch.where(m != 0, pg, 0.0) * w).sum()) / world
                sums["kl"] += float((kl * m).sum())
                sums["ent"] += float((ent * m).sum())
                sums["clip"] += float((clipped * m).sum())
                sums["akl"] += float(((mb.old_logprobs_B_T - lp) * m).sum())
                if bool((m != 0).any()):
                    r = torch.exp((lp - mb.old_logprobs_B_T).clamp(-20, 20))[m != 0]
                    ratio_max = max(ratio_max, float(r.max()))

        grad_norm = self._clip_grad()
        skipped = cfg.skip_nonfinite_grad and not math.isfinite(grad_norm)
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        tot = _all_reduce(
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
        )

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


# ------------------------------------------------------------------------------------------------
# Multi-GPU
# ------------------------------------------------------------------------------------------------
def wrap_fsdp(
    model: nn.Module,
    *,
    bf16: bool = False,
    reshard_after_forward: bool = True,
    layer_classes: Sequence[type[nn.Module]] | None = None,
) -> nn.Module:
    """Shard ``model`` over the default process group with torch FSDP2 (``fully_shard``).

    Each transformer block (HF ``_no_split_modules`` classes, or ``layer_classes``) becomes its own
    FSDP unit, then the root. ``bf16``: parameters in bf16 for compute, gradients reduced in fp32.
    Call after ``torch.distributed.init_process_group`` and after moving the model to its device;
    build the :class:`Learner` (and its optimizer) from the returned model.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError("wrap_fsdp needs torch.distributed.init_process_group() first")
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError as e:  # pragma: no cover - torch < 2.6
        raise ConfigError("wrap_fsdp needs torch >= 2.6 (fully_shard)") from e
    names = set(getattr(model, "_no_split_modules", None) or ())
    classes = tuple(layer_classes or ())
    mp = None
    if bf16:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kw: dict[str, Any] = {"reshard_after_forward": reshard_after_forward}
    if mp is not None:
        kw["mp_policy"] = mp
    n = 0
    for mod in model.modules():
        if mod is model:
            continue
        if (classes and isinstance(mod, classes)) or type(mod).__name__ in names:
            fully_shard(mod, **kw)
            n += 1
    if n == 0:
        raise ConfigError("wrap_fsdp found no transformer blocks to shard; pass layer_classes=(YourBlock,)")
    root_kw = dict(kw)
    root_kw["reshard_after_forward"] = False  # the head is used again right after the forward
    fully_shard(model, **root_kw)
    return model
