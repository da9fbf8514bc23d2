"""What a training step reports: episode metrics, its console line, a warning when limits cut answers."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from agentrl.episode import RolloutConfig
from agentrl.groups import Episode, episodes_of
from agentrl.reward_records import JudgeCall
from agentrl.types import TOKEN_LIMIT_STOPS, StopReason, ToolStatus, Trajectory

__all__ = [
    "PARSE_FAIL_WARN_FRAC",
    "TOKEN_LIMIT_STOPS",
    "UNCHANGED_WARN_FRAC",
    "Progress",
    "ToolUseAlarm",
    "episode_metrics",
    "format_async_row",
    "format_row",
    "reward_term_metrics",
    "stalled_update_warning",
    "token_limit_warning",
    "tool_use_alarm",
]

UNCHANGED_WARN_FRAC = 0.5
"""A step that leaves more than this fraction of the master weights exactly unchanged is warned about."""


PARSE_FAIL_WARN_FRAC = 0.5
"""A step where more than this fraction of the attempted tool calls failed to parse is warned about."""


def token_limit_warning(trajs: Sequence[Trajectory], rollout: RolloutConfig) -> str | None:
    """A warning when more than half of the episodes ended by a token limit: the limits look sized for
    shorter answers than this env needs (code, long reasoning). ``None`` otherwise. A multi-sample episode
    counts once, by how its last sample ended."""
    # Per episode: a compacted sample ends by design, not at a limit; the episode's end is its last sample's.
    ok = [t for t in (_merge(e) for e in episodes_of(trajs)) if not t.infra_failure]
    turn = sum(t.stop_reason is StopReason.TURN_TOKENS for t in ok)
    total = sum(t.stop_reason is StopReason.MAX_TOKENS for t in ok)
    if not ok or 2 * (turn + total) <= len(ok):
        return None
    flag, value = (
        ("--rollout.max-new-tokens", rollout.max_new_tokens)
        if turn >= total
        else ("--rollout.max-total-tokens", rollout.max_total_tokens)
    )
    # A turn cut mid-way holds exactly as many tokens as the limit that cut it: fewer than
    # --rollout.max-new-tokens means a lower limit did, the max_tokens an agent's own requests asked for
    # (behind the gateway).
    cut = {_last_turn_len(t) for t in ok if t.stop_reason is StopReason.TURN_TOKENS}
    own = "/".join(str(n) for n in sorted(cut) if 0 < n < rollout.max_new_tokens)
    at = f"the agent's own max_tokens={own}" if own else f"max_new_tokens={rollout.max_new_tokens}"
    fix = f"Raise {flag} (now {value}) if the env needs longer answers"
    if own and turn >= total:
        fix = (
            f"The agent's requests asked for max_tokens={own}, below --rollout.max-new-tokens "
            f"({rollout.max_new_tokens}): raise max_tokens in the agent if the task needs longer answers"
        )
    return (
        f"warning: {turn + total} of {len(ok)} episodes ended at a token limit ({turn} cut mid-turn at {at}, "
        f"{total} at max_total_tokens={rollout.max_total_tokens}); their final answers are cut off and score "
        f"as failures. {fix}"
    )


def _last_turn_len(t: Trajectory) -> int:
    """Tokens the model sampled in the episode's last turn (0 when it has none)."""
    from agentrl.types import TokenSource

    model = [g for g in t.segments if g.source is TokenSource.MODEL]
    return model[-1].end - model[-1].start if model else 0


@dataclasses.dataclass(frozen=True, slots=True)
class ToolUseAlarm:
    """Whether a step's model used the tools its env offered, in the format the run reads.

    Empty (no metrics, no warning) for a step whose episodes record no tool format: envs without tools.
    """

    metrics: dict[str, float]
    """``tools/parse_error_frac`` (of the attempted calls), ``tools/foreign_format_frac`` (of the episodes
    without a parsed call, those whose text reads as a call in another format) and ``tools/alarm`` (1.0 when
    :attr:`warning` is set)."""
    warning: str | None
    """The console warning, or None."""


def tool_use_alarm(
    trajs: Sequence[Trajectory], *, max_parse_fail: float = PARSE_FAIL_WARN_FRAC
) -> ToolUseAlarm:
    """Warn when an env offered tools and the model made no parsed call while its text holds calls in another
    format (which ``--rollout.tool-format`` would read them), or when more than ``max_parse_fail`` of the
    attempted calls failed to parse. A run that reads no call can still gain reward on the questions the
    model answers unaided, so neither failure shows in the reward curve."""
    from agentrl.tools.sniff import BARE_JSON, foreign_call_format

    ok = [t for t in trajs if not t.infra_failure and isinstance(t.meta.extra.get("tool_format"), str)]
    if not ok:
        return ToolUseAlarm({}, None)
    own = str(ok[0].meta.extra["tool_format"])
    calls = [r for t in ok for r in t.tool_calls]
    failed = sum(r.status is ToolStatus.PARSE_ERROR for r in calls)
    silent = [t for t in ok if not t.tool_calls]
    seen: dict[str, int] = {}
    for t in silent:
        found = next((f for f in (foreign_call_format(a, own) for a in t.actions) if f is not None), None)
        if found is not None:
            seen[found] = seen.get(found, 0) + 1
    warnings = []
    if not calls and seen:
        fmt, n = max(seen.items(), key=lambda kv: kv[1])
        how = (
            "no shipped format reads a JSON call inside other text: teach the format in the prompt"
            if fmt == BARE_JSON
            else f"--rollout.tool-format {fmt} would parse them"
        )
        warnings.append(
            f"the env offers tools but no tool call was parsed ({own} format) in {len(ok)} episodes, while "
            f"{n} of them wrote calls that look like the {fmt} format; {how}"
        )
    if calls and failed > max_parse_fail * len(calls):
        warnings.append(
            f"{failed} of {len(calls)} tool calls ({100 * failed / len(calls):.0f} %) failed to parse as the "
            f"{own} format (over {100 * max_parse_fail:.0f} %); see the tool messages in trajectories.jsonl"
        )
    metrics = {
        "tools/parse_error_frac": failed / len(calls) if calls else 0.0,
        "tools/foreign_format_frac": sum(seen.values()) / len(ok),
        "tools/alarm": float(bool(warnings)),
    }
    return ToolUseAlarm(metrics, "warning: " + "; and ".join(warnings) if warnings else None)


def stalled_update_warning(row: dict[str, float]) -> str | None:
    """A warning when the step's optimizer update left most of the weights exactly as they were
    (``learn/unchanged_frac``): the update rounded away, as it does with low-precision master weights and a
    small learning rate. ``None`` otherwise (also when the step was skipped or not measured)."""
    frac = row.get("learn/unchanged_frac", float("nan"))
    if not frac > UNCHANGED_WARN_FRAC:  # NaN (skipped, unmeasured) compares False
        return None
    return (
        f"warning: the update left {100 * frac:.1f} % of the master weights unchanged "
        f"(relative update {row.get('learn/update_rel_norm', float('nan')):.2e}): it rounds away in their "
        "precision, so the run barely learns. Keep float32 master weights (--master-dtype float32, the "
        "default) or raise the learning rate"
    )


def episode_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Rollout metrics of one step (infra failures are counted, not averaged in). Per episode: the samples
    of a multi-sample episode (compaction, sub-agents) count as one episode, with their rewards, tokens,
    turns and tool calls summed (docs/otb-multisample.md); ``episodes/samples_per_episode`` says how many
    samples an episode had on average."""
    samples = len(trajs)
    trajs = [_merge(e) for e in episodes_of(trajs)]
    ok = [t for t in trajs if not t.infra_failure]
    n = max(len(ok), 1)

    def mean(xs: Sequence[float]) -> float:
        return float(sum(xs) / n) if ok else float("nan")

    tool_errors = [sum(r.status is not ToolStatus.OK for r in t.tool_calls) for t in ok]
    # "Used the tool": ran code that succeeded and took another turn after reading its output.
    used = [any(r.status is ToolStatus.OK for r in t.tool_calls) and t.num_turns >= 2 for t in ok]
    obs_tokens = [len(t.token_ids) - t.num_model_tokens for t in ok]
    return {
        "reward/mean": mean([t.reward for t in ok]),
        "reward/pass_rate": mean([float(t.reward >= 1.0) for t in ok]),
        "tools/calls_per_episode": mean([len(t.tool_calls) for t in ok]),
        "tools/errors_per_episode": mean(tool_errors),
        "tools/used_frac": mean([float(u) for u in used]),
        "tokens/model_per_episode": mean([t.num_model_tokens for t in ok]),
        "tokens/observation_per_episode": mean(obs_tokens),
        "turns/per_episode": mean([t.num_turns for t in ok]),
        "episodes/total": float(len(trajs)),
        # Trajectories (samples) per episode, failed episodes included: 1.0 unless the env compacts its
        # context or runs sub-agents (docs/long-horizon.md).
        "episodes/samples_per_episode": samples / len(trajs) if trajs else float("nan"),
        "episodes/infra_failures": float(len(trajs) - len(ok)),
        "episodes/truncated": float(sum(t.truncated for t in ok)),
        "episodes/token_limit_frac": mean([float(t.stop_reason.is_token_limit) for t in ok]),
        "time/sandbox_s": float(sum(r.duration_s for t in trajs for r in t.tool_calls)),
    } | reward_term_metrics(ok)


def reward_term_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Each reward term's mean score per episode, ``reward/term/<name>`` (an episode without the term counts
    0), and the judge calls behind them: ``judge/calls`` (requests sent), ``judge/cached`` (answered from
    the cache), ``judge/latency_s`` (mean seconds per sent call). Empty when no env reported terms."""
    names = sorted({term.name for t in trajs for term in t.reward_terms})
    if not names:
        return {}
    n = len(trajs)
    row = {
        f"reward/term/{k}": sum(x.score for t in trajs for x in t.reward_terms if x.name == k) / n
        for k in names
    }
    calls = _calls(trajs)
    # A group judge's one request is recorded on every member it scored: count it once (same prompt key,
    # same latency: two separate requests never take the very same time).
    sent = list({(c.key, c.latency_s): c for c in calls if not c.cached}.values())
    if calls:
        row["judge/calls"] = float(len(sent))
        row["judge/cached"] = float(sum(c.cached for c in calls))
        row["judge/latency_s"] = sum(c.latency_s for c in sent) / len(sent) if sent else 0.0
    return row


def _calls(trajs: Sequence[Trajectory]) -> list[JudgeCall]:
    """Every judge call recorded on ``trajs``' reward terms, a group judge's shared one once per member."""
    return [c for t in trajs for x in t.reward_terms for c in x.judge_calls]


def _merge(samples: Episode) -> Trajectory:
    """One episode's samples as one record for the metrics above: rewards, tool calls, tokens (and so
    masks and segments) concatenated; the end is the last sample's; an infra failure in any sample counts."""
    if len(samples) == 1:
        return samples[0]
    last = samples[-1]
    infra = next((t for t in samples if t.infra_failure), None)
    shift, segments = 0, []
    for t in samples:
        segments += [dataclasses.replace(g, start=g.start + shift, end=g.end + shift) for g in t.segments]
        shift += len(t.token_ids)
    return dataclasses.replace(
        last,
        token_ids=tuple(x for t in samples for x in t.token_ids),
        loss_mask=tuple(x for t in samples for x in t.loss_mask),
        logprobs=tuple(x for t in samples for x in t.logprobs),
        segments=tuple(segments),
        tool_calls=tuple(c for t in samples for c in t.tool_calls),
        rewards=tuple(r for t in samples for r in t.rewards),
        reward_terms=tuple(x for t in samples for x in t.reward_terms),
        stop_reason=infra.stop_reason if infra is not None else last.stop_reason,
        errors=tuple(e for t in samples for e in t.errors),
    )


def format_row(step: int, row: dict[str, float]) -> str:
    """The console line of a step's metrics row (the keys it has, shortened)."""
    keys = [
        ("reward/mean", "reward"),
        ("reward/pass_rate", "pass"),
        ("tools/calls_per_episode", "calls"),
        ("tools/errors_per_episode", "tool_err"),
        ("tools/used_frac", "used_tool"),
        ("tokens/model_per_episode", "model_tok"),
        ("tokens/observation_per_episode", "obs_tok"),
        ("learn/grad_norm", "grad"),
        ("variance/proxy1_signal_strength", "signal"),
        ("variance/proxy3_pure_noise", "noise"),
        ("time/rollout_s", "rollout_s"),
        ("time/sandbox_s", "sandbox_s"),
        ("time/learn_s", "learn_s"),
    ]
    parts = [f"{short}={row[k]:.3g}" for k, short in keys if isinstance(row.get(k), int | float)]
    return f"step {step}: " + " ".join(parts)


def format_async_row(step: int, row: dict[str, float], *, staleness: int) -> str:
    """The console line of an asynchronous step: as :func:`format_row`, but its rollout time is the learner's
    wait for data, shown as ``overlapped`` when generation was hidden behind learning (a wait under 1 % of
    the generation time, or 10 ms), followed by the generation time that actually happened."""
    waited = float(row.get("time/rollout_s", 0.0))
    generated = float(row.get("time/generate_s", 0.0))
    line = format_row(step, {k: v for k, v in row.items() if k != "time/rollout_s"})
    shown = "overlapped" if waited < max(0.01, 0.01 * generated) else f"{waited:.3g}"
    idle = float(row.get("async/learner_idle_frac", 0.0))
    return f"{line} rollout_s={shown} generate_s={generated:.3g} staleness={staleness} idle={idle:.2f}"


class Progress:
    """A tqdm bar when available and wanted; a no-op otherwise."""

    def __init__(self, enabled: bool, total: int, desc: str):
        self.bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="ep", leave=False, dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Advance by ``n`` episodes and show ``postfix``."""
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def set(self, desc: str) -> None:
        """Change the bar's label."""
        if self.bar is not None:
            self.bar.set_description(desc)

    def close(self) -> None:
        """Remove the bar."""
        if self.bar is not None:
            self.bar.close()
