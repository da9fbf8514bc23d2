"""The consistency check of a recorded trajectory (offline: no env, no model), pointing at what is broken."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from agentrl.audit import audit_trajectory
from agentrl.errors import AuditError
from agentrl.replay.decode import model_segments, token_text
from agentrl.types import TokenSource, ToolStatus, Trajectory

__all__ = ["CheckReport", "Finding", "check"]


@dataclass(frozen=True)
class Finding:
    """One inconsistency in a recorded trajectory, and where it is."""

    kind: str
    """``length``, ``segments``, ``mask``, ``logprob``, ``audit``, ``tool_output``, ``tool_call``,
    ``action``."""
    message: str
    """What is wrong, in words."""
    token_index: int | None = None
    """The first token it concerns, if any."""
    call_id: str | None = None
    """The tool call it concerns, if any."""
    turn: int | None = None
    """The model turn it concerns, if any."""


@dataclass(frozen=True)
class CheckReport:
    """What :func:`check` found in one trajectory."""

    index: int | None
    """Position in the run (file order), if known."""
    episode_id: str
    """``meta.episode_id``."""
    findings: tuple[Finding, ...]
    """Every inconsistency found (at most a few per kind, then a count)."""
    audited: bool
    """True when the token audit (needs the tokenizer) ran too."""

    @property
    def ok(self) -> bool:
        """No finding."""
        return not self.findings


_PER_KIND = 5
_TOKEN_RE = re.compile(r"\btokens? \[?(\d+)")


def check(traj: Trajectory, tokenizer: Any = None, *, index: int | None = None) -> CheckReport:
    """Check a trajectory's record for internal consistency and point at what is broken.

    * columns: ids, mask and log-probs have one length; a log-prob exactly where the mask is 1; segments
      tile the ids and the mask is 1 exactly on ``MODEL`` segments (a shifted mask or log-prob column is
      named by its first token index);
    * with a tokenizer, the full token audit (:func:`agentrl.audit.audit_trajectory`): stop tokens, cut
      turns, decoded text of every segment against its message;
    * tool calls: each :class:`ToolRecord`'s output is what its ``tool`` message showed the model, and the
      assistant message of its turn made that call with those arguments (an edited record is named by its
      call id);
    * with a tokenizer and recorded actions: each action is the decoded text of its model turn.
    """
    findings: list[Finding] = []
    counts: dict[str, int] = {}

    def add(f: Finding) -> None:
        counts[f.kind] = counts.get(f.kind, 0) + 1
        if counts[f.kind] <= _PER_KIND:
            findings.append(f)

    n = len(traj.token_ids)
    columns_ok = True
    if len(traj.loss_mask) != n or len(traj.logprobs) != n:
        columns_ok = False
        add(
            Finding(
                "length",
                f"{n} token ids, {len(traj.loss_mask)} mask entries, {len(traj.logprobs)} log-probs",
                token_index=min(n, len(traj.loss_mask), len(traj.logprobs)),
            )
        )
    pos = 0
    for k, s in enumerate(traj.segments):
        if s.start != pos or s.end < s.start or s.end > n:
            columns_ok = False
            add(
                Finding(
                    "segments", f"segment {k} covers [{s.start}, {s.end}) but the next token is {pos}", pos
                )
            )
        pos = max(pos, s.end)
    if pos != n:
        columns_ok = False
        add(Finding("segments", f"segments cover {pos} of {n} tokens", token_index=min(pos, n)))
    if len(traj.loss_mask) == n and len(traj.logprobs) == n:
        for s in traj.segments:
            want = 1 if s.source is TokenSource.MODEL else 0
            for i in range(max(0, s.start), min(s.end, n)):
                if traj.loss_mask[i] != want:
                    columns_ok = False
                    add(
                        Finding(
                            "mask",
                            f"token {i} is a {s.source.value} token (turn {s.turn}) but has loss_mask "
                            f"{traj.loss_mask[i]}",
                            token_index=i,
                            turn=s.turn,
                        )
                    )
        for i in range(n):
            lp, mk = traj.logprobs[i], traj.loss_mask[i]
            if mk == 1 and (lp is None or not math.isfinite(lp) or lp > 1e-6):
                columns_ok = False
                add(Finding("logprob", f"token {i} is sampled (mask 1) but its log-prob is {lp!r}", i))
            elif mk != 1 and lp is not None:
                columns_ok = False
                add(
                    Finding(
                        "logprob",
                        f"token {i} is not sampled (mask {mk}) but carries log-prob {lp:.4g}: the log-prob "
                        "column is shifted against the mask",
                        i,
                    )
                )
    for kind, c in counts.items():
        if c > _PER_KIND:
            findings.append(Finding(kind, f"... and {c - _PER_KIND} more {kind} findings"))

    tx = token_text(tokenizer)
    audited = False
    if tx is not None and columns_ok:
        audited = True
        try:
            audit_trajectory(traj, tx.renderer if tx.renderer is not None else tx.tokenizer)
        except AuditError as e:
            m = _TOKEN_RE.search(str(e))
            findings.append(Finding("audit", str(e), token_index=int(m.group(1)) if m else None))

    findings.extend(_check_tool_records(traj))
    if tx is not None and traj.actions and columns_ok:
        segs = model_segments(traj)
        for k, action in enumerate(traj.actions):
            if k >= len(segs):
                findings.append(Finding("action", f"action {k} has no model turn", turn=k))
                break
            s = segs[k]
            text = tx.assistant_text(traj.token_ids[s.start : s.end])
            if text != action:
                findings.append(
                    Finding(
                        "action",
                        f"turn {k}: the action handed to the env {action[:60]!r} is not the decoded model "
                        f"turn {text[:60]!r}",
                        token_index=s.start,
                        turn=k,
                    )
                )
    return CheckReport(index, traj.meta.episode_id, tuple(findings), audited)


def _check_tool_records(traj: Trajectory) -> list[Finding]:
    out: list[Finding] = []
    segs = model_segments(traj)
    first_model_msg = min((s.message_index for s in segs if s.message_index is not None), default=None)
    # Tool messages of the prompt (worked examples) answer no recorded call; only later ones count.
    later = [(i, m) for i, m in enumerate(traj.messages) if first_model_msg is None or i > first_model_msg]
    tool_msgs = {m.tool_call_id: (i, m) for i, m in later if m.role == "tool" and m.tool_call_id}
    turn_msg = {s.turn: s.message_index for s in segs if s.message_index is not None}
    for rec in traj.tool_calls:
        hit = tool_msgs.get(rec.call_id)
        if hit is None:
            out.append(
                Finding(
                    "tool_output",
                    f"call {rec.call_id} ({rec.name}): no tool message answers it",
                    call_id=rec.call_id,
                    turn=rec.turn,
                )
            )
        else:
            mi, msg = hit
            if rec.output not in msg.content:
                out.append(
                    Finding(
                        "tool_output",
                        f"call {rec.call_id} ({rec.name}): the recorded output {_short(rec.output)} is not "
                        f"what the model was shown in message {mi} ({_short(msg.content)})",
                        call_id=rec.call_id,
                        turn=rec.turn,
                    )
                )
        ai = turn_msg.get(rec.turn)
        asst = traj.messages[ai] if ai is not None and 0 <= ai < len(traj.messages) else None
        if asst is not None and asst.tool_calls:
            made = {c.id: c for c in asst.tool_calls}
            call = made.get(rec.call_id)
            if call is None and rec.status not in (ToolStatus.PARSE_ERROR,):
                out.append(
                    Finding(
                        "tool_call",
                        f"call {rec.call_id}: turn {rec.turn}'s assistant message made no call with this id",
                        call_id=rec.call_id,
                        turn=rec.turn,
                    )
                )
            elif call is not None and (call.name != rec.name or call.arguments != rec.arguments):
                out.append(
                    Finding(
                        "tool_call",
                        f"call {rec.call_id}: recorded {rec.name}({_short(rec.arguments)}) but the model "
                        f"called {call.name}({_short(call.arguments)})",
                        call_id=rec.call_id,
                        turn=rec.turn,
                    )
                )
    return out


def _short(s: str, n: int = 60) -> str:
    return repr(s if len(s) <= n else s[: n - 3] + "...")
