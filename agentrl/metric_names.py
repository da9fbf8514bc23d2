"""The names of a training step's metrics: one registry for every key a line of ``metrics.jsonl`` may carry.

A step's row is put together from several producers, each computing its own part (the rollout's episodes,
dynamic sampling, the update, the stability schedule, the loop's timing, the Ray controller). The names they
write are listed here once, with what each means and who computes it, so that a plot, a comparison or a
reader of ``metrics.jsonl`` has one place to look and a new metric is one entry here plus its producer.
``tests/core/test_metric_names.py`` reads every producer's source and fails on a name missing from here,
or on an entry here that nothing produces.

Names are ``<family>/<name>``; :data:`METRIC_FAMILIES` holds the families whose names are made at run time
(one per reward term). The names are the file format: a name written by a run never changes meaning.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["METRICS", "METRIC_FAMILIES", "MetricName", "is_registered", "unregistered"]


@dataclass(frozen=True, slots=True)
class MetricName:
    """One registered metric."""

    producer: str
    """The module (and function) that computes it."""
    meaning: str
    """What the value is, in one line."""


def _family(producer: str, names: Mapping[str, str]) -> dict[str, MetricName]:
    return {name: MetricName(producer, meaning) for name, meaning in names.items()}


_EPISODES = "agentrl.trainers.step_metrics.episode_metrics"
_TOOLS = "agentrl.trainers.step_metrics.tool_use_alarm"
_JUDGE = "agentrl.trainers.step_metrics.reward_term_metrics"
_LOOP = "agentrl.trainers.loop"
_DRAWS = "agentrl.dynamic_sampling.draw_metrics"
_UPDATE = "agentrl.update.policy_update"
_LEARNER = "agentrl.learner.LearnerStats (via agentrl.update.policy_update)"
_VARIANCE = "agentrl.credit.VarianceProxy (via agentrl.update.policy_update)"
_STALENESS = "agentrl.update.score_and_credit"
_CORRECTION = "agentrl.learner.correction.importance_weights (via agentrl.update.score_and_credit)"
_STABILITY = "agentrl.learner.stability.StabilityStep.metrics"
_RAY = "agentrl.trainers.ray.RayRuntime.metrics"

METRICS: dict[str, MetricName] = {
    **_family(
        _EPISODES,
        {
            "reward/mean": "mean return per usable episode (samples of an episode summed)",
            "reward/pass_rate": "fraction of usable episodes with return >= 1",
            "tools/calls_per_episode": "tool calls per usable episode",
            "tools/errors_per_episode": "tool calls per usable episode whose status is not ok",
            "tools/used_frac": "episodes that ran a tool successfully and took another turn after it",
            "tokens/model_per_episode": "sampled (trained) tokens per usable episode",
            "tokens/observation_per_episode": "prompt and tool-output tokens per usable episode",
            "turns/per_episode": "model turns per usable episode",
            "episodes/total": "episodes of the step, infrastructure failures included",
            "episodes/samples_per_episode": "trajectories (samples) per episode; 1.0 without compaction",
            "episodes/infra_failures": "episodes the machinery failed (never trained on)",
            "episodes/truncated": "usable episodes that ended truncated",
            "episodes/token_limit_frac": "usable episodes ended by a token limit (TOKEN_LIMIT_STOPS)",
            "time/sandbox_s": "seconds spent in tool calls, summed over the step's episodes",
        },
    ),
    **_family(
        _JUDGE,
        {
            "judge/calls": "reward-judge requests sent",
            "judge/cached": "reward-judge calls answered from the cache",
            "judge/latency_s": "mean seconds per sent judge request",
        },
    ),
    **_family(
        _TOOLS,
        {
            "tools/parse_error_frac": "attempted tool calls that failed to parse in the run's format",
            "tools/foreign_format_frac": "episodes without a parsed call whose text reads as another format",
            "tools/alarm": "1.0 when the tool-use warning was printed",
        },
    ),
    **_family(
        _LOOP,
        {
            "episodes/reused": "episodes of complete groups reused from disk on resume",
            "time/rollout_s": "the learner's wait for data (with overlap, the generation not hidden)",
            "time/generate_s": "wall time the step's episodes were generating (asynchronous runs)",
            "time/learn_s": "the update, from the data being ready to the weights published",
            "time/publish_s": "handing the new weights to the samplers",
            "time/step_s": "one step: between two updates with overlap, else from its first lease",
            "async/learner_idle_frac": "time/rollout_s over time/step_s",
            "async/groups_in_flight": "groups still running when the step trained",
            "async/groups_dropped": "groups the step dropped (stale or stragglers)",
            "async/groups_dropped_total": "groups dropped so far in the run",
            "async/max_staleness_seen": "the largest staleness trained on so far",
        },
    ),
    **_family(
        _DRAWS,
        {
            "groups/drawn": "groups the step drew (refills included)",
            "groups/zero_variance": "groups whose members all got the same reward",
            "groups/filtered_zero_variance": "groups dynamic sampling dropped for zero reward variance",
            "groups/filtered_too_few_usable": "groups dynamic sampling dropped for too few usable members",
            "groups/trained": "groups the update trained on",
            "groups/capped": "1.0 when dynamic sampling hit its draw cap",
            "tokens/generated": "model tokens generated for the step (filtered groups included)",
            "tokens/trained_frac": "generated model tokens that reached the learner",
        },
    ),
    **_family(
        _UPDATE,
        {
            "learn/sampler_mismatch_max": "largest |log pi_sampler - log pi_learner| over model tokens",
            "learn/zero_advantage_skip": "1.0 when every advantage was zero and the step was skipped",
            "learn/adv_mean": "mean advantage over model tokens",
            "learn/adv_abs_mean": "mean |advantage| over model tokens",
        },
    ),
    **_family(
        _LEARNER,
        {
            "learn/loss": "the differentiated objective",
            "learn/pg_loss": "its policy-gradient part",
            "learn/kl": "token-mean k3 KL to the reference policy",
            "learn/entropy": "token-mean entropy on model tokens",
            "learn/grad_norm": "global gradient norm before clipping",
            "learn/clip_frac": "model tokens whose PPO ratio was clipped",
            "learn/approx_kl": "token-mean log pi_old - log pi",
            "learn/ratio_max": "largest importance ratio pi / pi_old",
            "learn/tokens": "model tokens in the batch (this rank)",
            "learn/sequences": "rows with a model token (this rank)",
            "learn/micro_batches": "forward/backward passes",
            "learn/skipped": "1.0 when the gradient was not finite and the step was skipped",
            "learn/recomputed_micro_batches": "micro-batches run with activation checkpointing",
            "learn/update_rel_norm": "|delta theta| / |theta| of the optimizer step",
            "learn/unchanged_frac": "weights with a gradient that the step left exactly unchanged",
        },
    ),
    **_family(
        _VARIANCE,
        {
            "variance/proxy1_signal_strength": "grad_norm squared (otb-spec.md section 4)",
            "variance/proxy2_total_power": "mean W * A^2 over rows",
            "variance/proxy3_pure_noise": "max(0, (proxy2 - proxy1) / (N - 1))",
            "variance/expected_a_squared": "mean A^2 over rows",
            "variance/expected_w": "mean W over rows",
            "variance/num_trajectories": "N, the rows of the batch",
        },
    ),
    **_family(
        _STALENESS,
        {
            "staleness/max": "largest staleness of a trained trajectory (asynchronous runs)",
            "staleness/mean": "mean staleness of the trained trajectories",
            "staleness/stale_token_frac": "model tokens sampled by an older version than the learner's",
        },
    ),
    **_family(
        _CORRECTION,
        {
            "correction/rho_mean": "mean truncated importance weight over corrected tokens",
            "correction/rho_min": "smallest importance weight over corrected tokens",
            "correction/rho_max": "largest importance weight over corrected tokens",
            "correction/clip_frac": "corrected tokens whose weight was truncated",
            "correction/corrected_token_frac": "model tokens the correction weighted",
            "correction/seq_masked_frac": "rows masked out by the sequence-level guard",
            "correction/ess": "effective sample size of the weights, as a fraction",
            "correction/kl_sampler_learner": "k1 estimate of KL(sampler || learner)",
            "correction/kl_k3_sampler_learner": "k3 estimate of KL(sampler || learner)",
            "correction/log_ratio_abs_max": "largest |log pi_learner - log pi_sampler|",
        },
    ),
    **_family(
        _STABILITY,
        {
            "learn/lr": "the learning rate this step's update used",
            "learn/lr_length_ratio": "the length trigger's signal (response length over its reference)",
            "learn/lr_decays": "learning-rate decays so far",
            "learn/response_length": "mean model tokens per episode of the step's groups",
            "stability/zero_variance_frac": "groups whose members all got the same reward",
            "stability/collapsed": "1.0 when the collapse detector fired",
            "stability/solved": "1.0 when every episode got the full reward (solved, not a collapse)",
            "stability/silent_steps": "steps in a row without reward signal",
        },
    ),
    **_family(
        _RAY,
        {
            "ray/groups_issued": "groups the ledger issued for the step",
            "ray/groups_dropped": "groups the ledger dropped for the step",
            "ray/leases_released": "leases released so far (dead workers, expired leases)",
            "ray/results_discarded": "late duplicate results discarded so far",
            "ray/workers_replaced": "rollout workers replaced so far",
        },
    ),
}
"""Every metric a training step writes, by name."""

METRIC_FAMILIES: dict[str, MetricName] = {
    "reward/term/": MetricName(_JUDGE, "each reward term's mean score per episode, by the term's name"),
}
"""Name prefixes whose names are made at run time."""


def is_registered(name: str) -> bool:
    """Whether ``name`` is a registered metric or in a registered family."""
    return name in METRICS or any(name.startswith(p) and len(name) > len(p) for p in METRIC_FAMILIES)


def unregistered(names: Iterable[str]) -> list[str]:
    """The names in ``names`` that are not registered (``step`` aside), sorted."""
    return sorted({n for n in names if n != "step" and not is_registered(n)})
