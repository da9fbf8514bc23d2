"""A recorded trajectory as a terminal transcript: messages, tool calls, the token stream by provenance."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.replay.decode import model_segments, session_label, token_text, turn_layout, version_label
from agentrl.replay.reports import TrajectoryRecompute
from agentrl.types import TokenSource, ToolStatus, Trajectory

__all__ = ["render"]

_SRC_STYLE = {
    TokenSource.PROMPT: "2",  # dim
    TokenSource.MODEL: "32",  # green
    TokenSource.OBSERVATION: "36",  # cyan
    TokenSource.TEMPLATE: "35",  # magenta
}
_BG_STYLE = {
    TokenSource.PROMPT: "100",
    TokenSource.MODEL: "42;30",
    TokenSource.OBSERVATION: "46;30",
    TokenSource.TEMPLATE: "45;30",
}


@dataclass(frozen=True)
class _Style:
    color: bool

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and text else text


def render(
    traj: Trajectory,
    *,
    tokenizer: Any = None,
    index: int | None = None,
    color: bool = False,
    tokens: bool = False,
    advantages: Sequence[float | None] | None = None,
    recomputed: TrajectoryRecompute | None = None,
    max_chars: int = 4000,
) -> str:
    """A trajectory as a terminal transcript.

    Header (identity, rewards, stop reason, token counts by source), each message (assistant turns with
    their tool calls; tool replies with the recorded status, duration and diagnostics), errors, then the
    token stream coloured by provenance (prompt dim, model green, observation cyan, template magenta; with
    ``color=False`` each run is bracketed ``[model| ... ]`` instead). ``tokens=True`` adds one line per
    sampled token: index, id, text, log-prob, and ``advantages``/``recomputed`` values when given.
    """
    st = _Style(color)
    tx = token_text(tokenizer)
    m = traj.meta
    out: list[str] = []
    head = f"trajectory {index}" if index is not None else "trajectory"
    sample = f"  sample {m.sample_index + 1}/{m.num_samples}" if m.num_samples > 1 else ""
    out.append(st(f"{head}  episode {m.episode_id or '?'}{sample}", "1"))
    out.append(
        f"  env {m.env_id or '?'}  task {m.task_id or '?'}  seed {m.seed}  step {m.step}"
        f"  group {m.group_id[:12]}  policy v{version_label(traj)}"
    )
    if m.provenance is not None:  # a distributed run: which worker, server and node ran it
        out.append(f"  ran on {m.provenance.label()}")
    session = session_label(traj)
    if session is not None:  # a gateway session split into several trajectories says where this one sits
        out.append(f"  {session}")
    by_src: dict[TokenSource, int] = {}
    for s in traj.segments:
        by_src[s.source] = by_src.get(s.source, 0) + (s.end - s.start)
    rewards = ", ".join(f"{r:g}" for r in traj.rewards) or "none"
    out.append(
        f"  reward {traj.reward:g} (per step: {rewards})  stop {traj.stop_reason.value}"
        f"  terminated={traj.terminated} truncated={traj.truncated}  turns {traj.num_turns}"
    )
    out.append(
        f"  tokens {len(traj.token_ids)}: "
        + ", ".join(f"{src.value} {by_src.get(src, 0)}" for src in TokenSource)
    )
    out.extend(_reward_terms(traj, max_chars))
    for e in traj.errors:
        out.append(
            st(f"  ERROR {e.kind} (turn {e.turn}, {'infra' if e.infra else 'episode'}): {e.message}", "31")
        )

    records = {r.call_id: r for r in traj.tool_calls}
    turn_of_msg = {s.message_index: s for s in model_segments(traj) if s.message_index is not None}
    n_init, _ = turn_layout(traj)
    out.append("")
    for i, msg in enumerate(traj.messages):
        label = msg.role
        seg = turn_of_msg.get(i)
        if seg is not None:
            lps = [lp for lp in traj.logprobs[seg.start : seg.end] if lp is not None]
            mean = f", mean log-prob {sum(lps) / len(lps):.3f}" if lps else ""
            label += f" · turn {seg.turn} · {seg.end - seg.start} tokens{mean}"
        elif i < n_init:
            label += " · prompt"
        rec = records.get(msg.tool_call_id or "") if msg.role == "tool" and i >= n_init else None
        if rec is not None:
            color_code = "32" if rec.status is ToolStatus.OK else "31"
            label += (
                " · "
                + st(f"{rec.name} {rec.call_id} {rec.status.value}", color_code)
                + f" {rec.duration_s:.2f}s"
            )
        out.append(st(f"── [{i}] {label} ", "1") + "─" * 8)
        out.append(_clip(msg.content, max_chars))
        for call in msg.tool_calls:
            r = records.get(call.id)
            status = f" → {r.status.value}" if r is not None else " → not run"
            out.append(st(f"   ↳ call {call.id}: {call.name}({_clip(call.arguments, 200)}){status}", "33"))
        if rec is not None and rec.detail:
            out.append(st(f"   detail: {_clip(rec.detail, 500)}", "2"))
    orphan = [r for r in traj.tool_calls if not any(msg.tool_call_id == r.call_id for msg in traj.messages)]
    for r in orphan:
        out.append(st(f"── tool record {r.call_id} ({r.name}, {r.status.value}) with no tool message", "31"))
        out.append(_clip(r.output, max_chars))

    out.append("")
    legend = "  ".join(st(f" {src.value} ", _BG_STYLE[src] if color else "") for src in TokenSource)
    out.append(st("── token stream ", "1") + legend)
    if tx is None:
        out.append("(no tokenizer: ids only)")
        for s in traj.segments:
            out.append(f"[{s.source.value}|{' '.join(map(str, traj.token_ids[s.start : s.end]))}]")
    else:
        parts = []
        for s in traj.segments:
            text = tx.decode(traj.token_ids[s.start : s.end])
            parts.append(st(text, _SRC_STYLE[s.source]) if color else f"[{s.source.value}|{text}]")
        out.append("".join(parts))

    if tokens:
        out.append("")
        cols = "  index     id  text                  log-prob"
        if advantages is not None:
            cols += "   advantage"
        if recomputed is not None:
            cols += "  recomputed      diff     Σπ²"
        out.append(st(cols, "1"))
        for s in model_segments(traj):
            out.append(st(f"  turn {s.turn}: tokens [{s.start}, {s.end})", "2"))
            for i in range(s.start, s.end):
                tid = traj.token_ids[i]
                text = repr(tx.token(tid))[1:-1] if tx else ""
                lp = traj.logprobs[i]
                line = f"  {i:5d} {tid:6d}  {text[:20]:20s}  {_num(lp, 9)}"
                if advantages is not None:
                    line += f"  {_num(advantages[i] if i < len(advantages) else None, 10)}"
                if recomputed is not None:
                    r_lp = recomputed.logprobs[i] if i < len(recomputed.logprobs) else None
                    sp = recomputed.sum_pi_squared[i] if i < len(recomputed.sum_pi_squared) else None
                    d = abs(lp - r_lp) if lp is not None and r_lp is not None else None
                    line += f"  {_num(r_lp, 10)} {_num(d, 9)} {_num(sp, 7)}"
                out.append(line)
    return "\n".join(out)


def _reward_terms(traj: Trajectory, max_chars: int) -> list[str]:
    """Why the reward is what it is: each graded term and the judge calls behind it."""
    out = []
    for t in traj.reward_terms:
        out.append(f"  term {t.name} (turn {t.turn}): {t.score:g} x {t.weight:g}  {_clip(t.reason, 200)}")
        for c in t.judge_calls:
            how = "cached" if c.cached else f"{c.latency_s:.2f}s, {c.attempts} attempt(s)"
            out.append(f"    judge {c.judge} ({how}) -> {c.score:g}")
            out.append("      prompt: " + _clip(c.prompt, max_chars).replace("\n", "\n      "))
            out.append("      answer: " + _clip(c.raw, max_chars).replace("\n", "\n      "))
    return out


def _num(x: float | None, w: int) -> str:
    return f"{'-':>{w}}" if x is None else f"{x:{w}.4f}"


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n] + f"... [{len(s) - n} more chars]"
