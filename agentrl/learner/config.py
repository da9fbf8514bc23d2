"""What the learner is told (:class:`LearnerConfig`) and what one step reports (:class:`LearnerStats`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from agentrl.errors import ConfigError
from agentrl.learner.aggregation import LOSS_AGGS, LossAgg
from agentrl.learner.attention import ATTENTION_CHOICES, AttentionName
from agentrl.learner.checkpointing import CheckpointingMode, checkpointing_mode
from agentrl.learner.losses import PolicyLossName
from agentrl.learner.schedule import LRScheduleName, validate_options

__all__ = ["LearnerConfig", "LearnerStats", "LossAgg"]

_LOSS_AGGS = LOSS_AGGS


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
    the batch (and over ranks), so micro-batching does not change the gradient. A sequence is one sample:
    an episode split into several samples (compaction, sub-agents) counts once per sample;
    ``episode-mean-token-mean`` (every episode weighs the same, its samples' tokens share it) and
    ``episode-mean-token-sum`` count it once (agentrl.learner.aggregation)."""
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
    whole batch at once. A row longer than the budget gets a micro-batch of its own, run with activation
    checkpointing (HF models) so that one long episode cannot raise the update's memory peak above what
    the budget allows. 0 = chosen for the device (:mod:`agentrl.learner.sizing`: 384 on CPU, from the free
    memory on CUDA)."""
    lr: float = 1e-6
    """Learning rate of the default AdamW (ignored when an optimizer is passed)."""
    weight_decay: float = 0.0
    """Weight decay of the default AdamW."""
    temperature: float = 1.0
    """Sampling temperature: log-probs and Σπ² are those of softmax(logits / temperature)."""
    chunk_size: int = 1024
    """Tokens per chunk through the LM head (extra memory ≈ chunk_size × vocab × 4 bytes × a
    few). 0 = chosen for the device (128 on CPU, from the free memory on CUDA)."""
    bf16_autocast: bool = False
    """Run forward passes under bf16 autocast (meant for CUDA; works, slowly, on CPU)."""
    gradient_checkpointing: CheckpointingMode = "auto"
    """HF activation checkpointing in the update's forward and backward passes (less memory, one extra
    forward; :mod:`agentrl.learner.checkpointing`): ``on`` every micro-batch, ``off`` none (but a row longer
    than ``micro_batch_tokens``), ``auto`` those that would not fit the device's memory otherwise (measured on
    CUDA by a probe in the first update; off on CPU). ``true``/``false`` (and booleans) mean on/off. Off again
    after each micro-batch, so a sampler sharing the model generates with its KV cache."""
    skip_nonfinite_grad: bool = True
    """Skip the optimizer step (and report ``skipped``) when the gradient norm is NaN or inf."""
    measure_update: bool = True
    """Measure what each step did to the weights (``update_rel_norm``, ``unchanged_frac``): the step is taken
    in slices of parameters, each compared before and after (one slice of extra memory). This is what shows
    an update rounding away in low-precision master weights."""
    pack_sequences: bool = True
    """Pack each micro-batch's sequences end to end in rows without padding (per-sequence positions,
    attention kept inside each sequence) for HF causal LMs that support it; other models, or False, get
    right-padded rows. Results agree to floating-point rounding."""
    lr_schedule: LRScheduleName = "constant"
    """Learning-rate schedule of the trainers: ``constant`` (``lr`` every step) or ``length-triggered``
    (multiply the rate by ``lr_decay`` when the mean response length surges by ``lr_trigger`` within
    ``lr_window`` steps; :mod:`agentrl.learner.schedule`, docs/reproduction.md "Stability")."""
    lr_window: int = 10
    """length-triggered: steps per window; the signal compares the last window's mean length with the
    window before it."""
    lr_trigger: float = 1.3
    """length-triggered: decay when the recent window's mean length is at least this multiple of the
    previous window's (1.3 = 30 % longer)."""
    lr_decay: float = 0.5
    """length-triggered: the factor each trigger multiplies the rate by."""
    lr_floor: float = 0.1
    """length-triggered: the rate never goes below this fraction of ``lr``."""
    attention: AttentionName = "auto"
    """Attention implementation of the learner's passes (:mod:`agentrl.learner.attention`): ``auto``
    (flash_attention_2 where flash_attn imports on CUDA, else sdpa; flex_attention only when named; on CPU
    the model's own, sdpa), ``sdpa``, ``flex_attention``, ``flash_attention_2`` or ``eager``. Set on the model
    only during the learner's passes; a sampler sharing the model keeps its own. Packed rows take the
    document-masked kernels (flex, flash) without a dense [T, T] mask."""

    @property
    def checkpointing(self) -> Literal["auto", "on", "off"]:
        """``gradient_checkpointing`` as auto, on or off (true/false and booleans are on/off)."""
        return checkpointing_mode(self.gradient_checkpointing)

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
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 0:
            raise ConfigError(
                f"micro_batch_tokens must be >= 1, 0 (for the device) or None, got {self.micro_batch_tokens}"
            )
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if self.chunk_size < 0:
            raise ConfigError(f"chunk_size must be >= 1 or 0 (for the device), got {self.chunk_size}")
        if self.attention not in ATTENTION_CHOICES:
            raise ConfigError(f"attention must be one of {ATTENTION_CHOICES}, got {self.attention!r}")
        checkpointing_mode(self.gradient_checkpointing)  # validated, kept as written (old configs read back)
        validate_options(self.lr_schedule, self.lr_window, self.lr_trigger, self.lr_decay, self.lr_floor)


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
    recomputed_micro_batches: int = 0
    """Micro-batches over ``micro_batch_tokens`` (one long row) run with activation checkpointing."""
    update_rel_norm: float = math.nan
    """‖Δθ‖ / ‖θ‖ of the optimizer step over the weights the optimizer holds (the master weights); NaN when
    the step was skipped or not measured."""
    unchanged_frac: float = math.nan
    """Of the weights' elements with a nonzero gradient, the fraction the step left exactly unchanged (near 1
    means the update rounded away, e.g. a small learning rate on bfloat16 master weights); NaN when no element
    had a gradient (all advantages zero), or the step was skipped or not measured."""

    def to_dict(self, prefix: str = "actor/") -> dict[str, float]:
        """Flat metrics for a logger."""
        return {prefix + k: float(getattr(self, k)) for k in self.__slots__}
