"""Replay recorded trajectories: list, render, check, re-execute, re-score, recompute and reproduce a step.

A run made by ``agentrl train`` records everything needed to replay it: the exact token stream of every
episode (ids, loss mask, sampler log-probs, provenance), the conversation, every tool call with its output,
the text of each model turn handed to ``Env.step``, the env id and seed, and the step's metrics and weights.
This module turns that record into answers::

    from agentrl import replay

    run = replay.load("runs/math-tir-v0-20260101")          # a run dir or a trajectories.jsonl
    bad = replay.filter(run.trajectories, tool_status="error", max_reward=0)
    print(replay.render(bad[0], tokenizer=replay.load_tokenizer_for(run)))
    replay.check(bad[0], tokenizer)          # mask / log-prob / provenance / tool-record consistency
    replay.reexec(bad[0], env_kwargs=...)    # re-run every tool call in a fresh env (real sandbox), diff
    replay.rescore(bad[0])                   # the env's checker on the recorded turns, vs recorded rewards
    replay.recompute_run(run)                # log π and Σπ² with the weights that sampled each episode
    replay.reproduce_step(run, 3)            # step 3's advantages and loss from the record + checkpoint
    replay.write_html(run, "run.html")       # one self-contained page to browse the run

Re-execution works through the ``Env`` contract alone: a fresh env (``agentrl.make(meta.env_id,
**env_kwargs)``) is reset with the recorded seed and fed the recorded actions in order; each observation,
parsed assistant message, tool record and reward is compared with the recorded one. Every report is a frozen
dataclass; ``ok``/``matches`` say whether anything differed, and each difference names where it is (token
index, call id, turn).
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import functools
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import AgentRLError, AuditError, ConfigError, StoreError
from agentrl.groups import group_trajectories
from agentrl.store import StoreIssue, read_trajectories
from agentrl.types import Message, StopReason, TokenSource, ToolRecord, ToolStatus, Trajectory

if TYPE_CHECKING:
    from agentrl.env import Env

__all__ = [
    "CallReplay",
    "CheckReport",
    "Filter",
    "Finding",
    "MetricCheck",
    "RecomputeReport",
    "ReexecReport",
    "RescoreReport",
    "Run",
    "StepReplay",
    "StepReport",
    "TokenDiff",
    "TrajectoryRecompute",
    "actions_of",
    "areexec",
    "areexec_many",
    "arescore",
    "check",
    "filter",
    "load",
    "load_tokenizer_for",
    "load_weights",
    "recompute",
    "recompute_run",
    "reexec",
    "render",
    "reproduce_step",
    "rescore",
    "select",
    "step_advantages",
    "step_batch",
    "write_html",
]

_CKPT_PREFIX = "step-"


# =====================================================================================================
# Loading
# =====================================================================================================
@dataclass(frozen=True)
class Run:
    """A recorded run: its trajectories and, for a run directory, its config, metrics and checkpoints."""

    path: Path
    """What was loaded (a run directory or a JSONL file)."""
    trajectories_path: Path
    """The JSONL file the trajectories came from."""
    run_dir: Path | None
    """The run directory (has ``config.json``), or None for a bare JSONL file."""
    trajectories: tuple[Trajectory, ...]
    """Every readable trajectory, in file order; ``--show K`` and reports use these indices."""
    config: Mapping[str, Any] | None = None
    """``config.json`` as a dict (the trainer's settings), or None."""
    metrics: tuple[Mapping[str, Any], ...] = ()
    """``metrics.jsonl`` rows, one per training step."""
    issues: tuple[StoreIssue, ...] = ()
    """Lines that could not be read (a torn last line)."""

    def checkpoint_steps(self) -> tuple[int, ...]:
        """Steps whose checkpoint is on disk (``checkpoints/step-N`` = weights after N steps)."""
        if self.run_dir is None:
            return ()
        root = self.run_dir / "checkpoints"
        if not root.is_dir():
            return ()
        steps = []
        for p in root.iterdir():
            if p.name.startswith(_CKPT_PREFIX) and (p / "model").is_dir():
                try:
                    steps.append(int(p.name[len(_CKPT_PREFIX) :]))
                except ValueError:
                    continue
        return tuple(sorted(steps))

    def checkpoint_dir(self, step: int) -> Path | None:
        """``checkpoints/step-N/model`` if it is on disk."""
        if self.run_dir is None:
            return None
        p = self.run_dir / "checkpoints" / f"{_CKPT_PREFIX}{step:06d}" / "model"
        return p if p.is_dir() else None

    def metrics_row(self, step: int) -> Mapping[str, Any] | None:
        """The ``metrics.jsonl`` row of ``step`` (the last one if a resume rewrote it)."""
        rows = [r for r in self.metrics if r.get("step") == step]
        return rows[-1] if rows else None

    def setting(self, dotted: str, default: Any = None) -> Any:
        """A value of ``config.json`` by dotted name (``"learner.temperature"``)."""
        cur: Any = self.config
        for part in dotted.split("."):
            if not isinstance(cur, Mapping) or part not in cur:
                return default
            cur = cur[part]
        return cur


def load(path: str | os.PathLike[str]) -> Run:
    """Load a run directory (``trajectories.jsonl`` + ``config.json`` + ``metrics.jsonl``) or a JSONL file.

    A JSONL file whose folder holds a ``config.json`` is treated as that run's record.
    """
    p = Path(path)
    if p.is_dir():
        traj_path = p / "trajectories.jsonl"
        if not traj_path.exists():
            raise StoreError(f"{p} has no trajectories.jsonl; pass a run directory or a .jsonl file")
    elif p.exists():
        traj_path = p
    else:
        raise StoreError(f"{p} does not exist")
    folder = traj_path.parent
    run_dir = folder if (folder / "config.json").exists() else None
    issues: list[StoreIssue] = []
    trajs = tuple(read_trajectories(traj_path, issues=issues))
    config = None
    metrics: tuple[Mapping[str, Any], ...] = ()
    if run_dir is not None:
        try:
            config = json.loads((run_dir / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise StoreError(f"{run_dir}/config.json is unreadable: {e}") from e
        if (run_dir / "metrics.jsonl").exists():
            from agentrl.metrics import read_metrics

            metrics = tuple(read_metrics(run_dir))
    return Run(p, traj_path, run_dir, trajs, config, metrics, tuple(issues))


# =====================================================================================================
# Filtering
# =====================================================================================================
_STOPS = {s.value for s in StopReason}
_STATUSES = {s.value for s in ToolStatus}


@dataclass(frozen=True)
class Filter:
    """Which trajectories to keep; every given criterion must hold (``None`` = any)."""

    step: int | None = None
    """``meta.step`` equals this."""
    group: str | None = None
    """``meta.group_id`` starts with this, or ``meta.task_id`` equals it."""
    min_reward: float | None = None
    """Total reward ≥ this."""
    max_reward: float | None = None
    """Total reward ≤ this."""
    stop_reason: str | None = None
    """``stop_reason`` equals this (``terminated``, ``max_turns``, ``turn_tokens``, ...)."""
    errors: bool | None = None
    """True: only episodes with a recorded failure (or a non-ok tool call); False: only clean ones."""
    tool_status: str | None = None
    """Some tool call ended with this status (``ok``, ``error``, ``timeout``, ...)."""
    grep: str | None = None
    """Case-insensitive text in a message, a tool call's arguments or output, or an action."""

    def __post_init__(self) -> None:
        if self.stop_reason is not None and self.stop_reason not in _STOPS:
            raise ConfigError(f"unknown stop reason {self.stop_reason!r}; one of {sorted(_STOPS)}")
        if self.tool_status is not None and self.tool_status not in _STATUSES:
            raise ConfigError(f"unknown tool status {self.tool_status!r}; one of {sorted(_STATUSES)}")

    def matches(self, traj: Trajectory) -> bool:
        """Whether ``traj`` passes every criterion."""
        m = traj.meta
        if self.step is not None and m.step != self.step:
            return False
        if self.group is not None and not (m.group_id.startswith(self.group) or m.task_id == self.group):
            return False
        r = traj.reward
        if self.min_reward is not None and r < self.min_reward:
            return False
        if self.max_reward is not None and r > self.max_reward:
            return False
        if self.stop_reason is not None and traj.stop_reason.value != self.stop_reason:
            return False
        if self.errors is not None and _has_errors(traj) != self.errors:
            return False
        if self.tool_status is not None and not any(
            c.status.value == self.tool_status for c in traj.tool_calls
        ):
            return False
        if self.grep:
            needle = self.grep.lower()
            hay = (
                *(msg.content for msg in traj.messages),
                *(c.arguments for msg in traj.messages for c in msg.tool_calls),
                *(f"{c.name} {c.arguments}\n{c.output}\n{c.detail}" for c in traj.tool_calls),
                *traj.actions,
                *(e.message for e in traj.errors),
            )
            if not any(needle in h.lower() for h in hay):
                return False
        return True


def _has_errors(traj: Trajectory) -> bool:
    return (
        bool(traj.errors) or traj.infra_failure or any(c.status is not ToolStatus.OK for c in traj.tool_calls)
    )


def filter(trajectories: Iterable[Trajectory], **criteria: Any) -> list[Trajectory]:
    """The trajectories matching every criterion of :class:`Filter` (``step=``, ``grep=``, ...)."""
    f = Filter(**criteria)
    return [t for t in trajectories if f.matches(t)]


def select(run: Run, **criteria: Any) -> list[int]:
    """Indices (file order) of ``run``'s trajectories matching every criterion of :class:`Filter`."""
    f = Filter(**criteria)
    return [i for i, t in enumerate(run.trajectories) if f.matches(t)]


# =====================================================================================================
# Tokenizer and weights of a run
# =====================================================================================================
def load_tokenizer_for(run: Run | None, path: str | os.PathLike[str] | None = None) -> Any | None:
    """The tokenizer of a run: ``path`` if given, else a checkpoint's, else the one its ``model`` setting
    names (``tiny``/``smollm2`` use SmolLM2's). None when nothing says which (a bare JSONL file)."""
    if path is not None:
        p = Path(path)
        if (p / "model").is_dir():
            p = p / "model"
        return _tokenizer_at(str(p.resolve()))
    if run is None:
        return None
    steps = run.checkpoint_steps()
    if steps:
        ckpt = run.checkpoint_dir(steps[-1])
        if ckpt is not None and (ckpt / "tokenizer_config.json").exists():
            return _tokenizer_at(str(ckpt.resolve()))
    model = run.setting("model")
    if model in ("tiny", "smollm2"):
        from agentrl.models import smollm2_tokenizer

        return smollm2_tokenizer()
    if isinstance(model, str) and (Path(model) / "config.json").exists():
        return _tokenizer_at(str(Path(model).resolve()))
    return None


@functools.lru_cache(maxsize=8)
def _tokenizer_at(path: str) -> Any:
    """Tokenizers take seconds to load and every checkpoint of a run holds the same one: load once."""
    from agentrl.models import load_tokenizer

    return load_tokenizer(path)


def _device_dtype(run: Run, device: str | None, dtype: str | None) -> tuple[Any, Any]:
    """The trainer's rule (``auto``: CUDA + bf16 when present, else CPU + fp32), unless overridden."""
    import torch

    dev_s = device or run.setting("device", "auto") or "auto"
    if dev_s == "auto":
        dev_s = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(dev_s)
    dt_s = dtype or run.setting("dtype", "auto") or "auto"
    if dt_s == "auto":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    dt: Any = getattr(torch, str(dt_s), None)
    if not isinstance(dt, torch.dtype):
        raise ConfigError(f"unknown dtype {dt_s!r}")
    return dev, dt


def load_weights(
    run: Run, version: int, *, device: str | None = None, dtype: str | None = None
) -> tuple[Any, str]:
    """The policy weights of ``version`` (= after ``version`` training steps) as ``(model, description)``.

    ``checkpoints/step-N/model`` when it is on disk. Version 0 without a checkpoint is rebuilt from the
    run's ``model`` setting (``tiny`` is re-initialised with the run's seed; ``smollm2`` or a folder is
    loaded), exactly as the trainer built it. Raises :class:`StoreError` when the checkpoint was rotated
    away (the trainer keeps only the newest ``keep_checkpoints``).
    """
    from agentrl.models import load_model

    dev, dt = _device_dtype(run, device, dtype)
    ckpt = run.checkpoint_dir(version)
    if ckpt is not None:
        return load_model(ckpt, dtype=dt, device=dev), str(ckpt)
    model_setting = run.setting("model")
    if version == 0 and model_setting is not None:
        if model_setting == "tiny":
            from agentrl.models import smollm2_tokenizer, tiny_model

            seed = int(run.setting("seed", 0))
            tok: Any = smollm2_tokenizer()
            model: Any = tiny_model(tok, seed=seed)
            model = model.to(device=dev, dtype=dt)
            return model, f"initial weights rebuilt (tiny model, seed {seed})"
        if model_setting == "smollm2":
            from agentrl.models import smollm2_dir

            return load_model(smollm2_dir(), dtype=dt, device=dev), "initial weights (smollm2)"
        if (Path(str(model_setting)) / "config.json").exists():
            return load_model(model_setting, dtype=dt, device=dev), f"initial weights ({model_setting})"
    kept = run.checkpoint_steps()
    where = run.run_dir / "checkpoints" if run.run_dir is not None else "(no run directory)"
    if run.run_dir is None:
        raise StoreError(
            f"weights of policy version {version} are unknown: {run.trajectories_path} is not inside a run "
            "directory; pass a model folder (--model)"
        )
    keep = run.setting("keep_checkpoints")
    newest = max(kept) if kept else None
    if newest is not None and version < newest:
        why = (
            f"it was rotated away: the run keeps only the newest {keep} checkpoints "
            f"(on disk: {', '.join(f'step-{s}' for s in kept)}). Re-run with a larger --keep-checkpoints "
            "to replay older steps"
        )
    else:
        why = f"it was never written (on disk: {', '.join(f'step-{s}' for s in kept) or 'none'})"
    raise StoreError(f"no checkpoint {_CKPT_PREFIX}{version:06d} in {where}: {why}")


# =====================================================================================================
# Decoding helpers
# =====================================================================================================
class _Text:
    """Decode token ids with a tokenizer, per token cached (a vocabulary is small, a run is not)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
        self._backend = backend if hasattr(backend, "decode") else None
        self._cache: dict[int, str] = {}
        self.renderer: Any = None
        try:
            from agentrl.chat import ChatRenderer

            self.renderer = ChatRenderer(tokenizer)
        except AgentRLError:
            self.renderer = None

    def decode(self, ids: Sequence[int]) -> str:
        if self._backend is not None:
            return str(self._backend.decode(list(ids), skip_special_tokens=False))
        return str(
            self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        )

    def token(self, tid: int) -> str:
        s = self._cache.get(tid)
        if s is None:
            s = self._cache[tid] = self.decode([tid])
        return s

    def is_stop(self, tid: int) -> bool:
        return self.renderer is not None and self.renderer.is_stop(tid)

    def assistant_text(self, ids: Sequence[int]) -> str:
        if self.renderer is not None:
            return str(self.renderer.assistant_text(ids))
        return self.decode(ids)


def _text(tokenizer: Any) -> _Text | None:
    if tokenizer is None:
        return None
    return tokenizer if isinstance(tokenizer, _Text) else _Text(tokenizer)


def _model_segments(traj: Trajectory) -> list[Any]:
    return [s for s in traj.segments if s.source is TokenSource.MODEL]


def actions_of(traj: Trajectory, tokenizer: Any = None) -> tuple[tuple[str, ...], str]:
    """The text of each model turn that was handed to ``Env.step``, and where it came from.

    ``Trajectory.actions`` when recorded (``"recorded"``). Older records without it: each model segment
    that ends with a stop token (exactly the turns the rollout handed to ``step``), decoded without its
    stop token (``"decoded"``) — needs the tokenizer.
    """
    if traj.actions:
        return tuple(traj.actions), "recorded"
    segs = _model_segments(traj)
    if not segs:
        return (), "recorded"
    tx = _text(tokenizer)
    if tx is None:
        raise ConfigError(
            f"trajectory {traj.meta.episode_id or '?'} has no recorded actions; a tokenizer is needed to "
            "decode them from its model tokens (--tokenizer)"
        )
    out = []
    for s in segs:
        ids = traj.token_ids[s.start : s.end]
        if ids and tx.is_stop(ids[-1]):
            out.append(tx.assistant_text(ids))
    return tuple(out), "decoded"


# =====================================================================================================
# Consistency check (offline: no env, no model)
# =====================================================================================================
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

    tx = _text(tokenizer)
    audited = False
    if tx is not None and columns_ok:
        from agentrl.audit import audit_trajectory

        audited = True
        try:
            audit_trajectory(traj, tx.renderer if tx.renderer is not None else tx.tokenizer)
        except AuditError as e:
            m = _TOKEN_RE.search(str(e))
            findings.append(Finding("audit", str(e), token_index=int(m.group(1)) if m else None))

    findings.extend(_check_tool_records(traj))
    if tx is not None and traj.actions and columns_ok:
        segs = _model_segments(traj)
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
    segs = _model_segments(traj)
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


# =====================================================================================================
# Re-execution and re-scoring through a fresh env
# =====================================================================================================
@dataclass(frozen=True)
class CallReplay:
    """One recorded tool call, run again."""

    call_id: str
    """The call's id."""
    name: str
    """Tool name."""
    turn: int
    """Model turn that made the call."""
    verdict: str
    """``identical`` (same status and output), ``different``, ``missing`` (the replay made no such
    call) or ``extra`` (the replay made a call the record lacks)."""
    recorded_status: str | None
    """Status in the record."""
    replayed_status: str | None
    """Status now."""
    recorded_output: str | None
    """Output in the record."""
    replayed_output: str | None
    """Output now."""
    diff: str = ""
    """Unified diff recorded → replayed (empty when identical)."""


@dataclass(frozen=True)
class StepReplay:
    """One ``Env.step`` of the replay against the record."""

    turn: int
    """Model turn."""
    recorded_reward: float | None
    """Reward in the record (None if the record has none for this turn)."""
    replayed_reward: float | None
    """Reward the env returned now (None if the step failed)."""
    observation_identical: bool
    """The env answered with the same messages."""
    assistant_identical: bool
    """The env parsed the turn into the same assistant message (content and tool calls)."""
    diff: str = ""
    """Unified diff of the messages (recorded → replayed) when they differ."""
    error: str = ""
    """The exception the env raised, if any."""


@dataclass(frozen=True)
class ReexecReport:
    """A trajectory replayed through a fresh env with its recorded seed and actions."""

    index: int | None
    """Position in the run, if known."""
    episode_id: str
    """``meta.episode_id``."""
    env_id: str
    """Environment that was built."""
    seed: int | None
    """Seed passed to ``reset`` (None: the record has none; the task may differ)."""
    actions_source: str
    """``recorded`` (``Trajectory.actions``) or ``decoded`` (from the model tokens)."""
    reset_identical: bool
    """``reset`` returned the recorded initial messages."""
    reset_diff: str
    """Their diff when not."""
    steps: tuple[StepReplay, ...]
    """One per action fed."""
    calls: tuple[CallReplay, ...]
    """One per tool call (recorded or replayed)."""
    recorded_end: tuple[bool, bool]
    """Recorded (terminated, truncated)."""
    replayed_end: tuple[bool, bool]
    """(terminated, truncated) of the replay's last step."""
    error: str = ""
    """Why the replay could not run at all (env construction or reset failed)."""

    @property
    def different_calls(self) -> tuple[CallReplay, ...]:
        """Calls whose verdict is not ``identical``."""
        return tuple(c for c in self.calls if c.verdict != "identical")

    @property
    def ok(self) -> bool:
        """Everything replayed identically: reset, every observation, assistant message and tool call."""
        return (
            not self.error
            and self.reset_identical
            and not self.different_calls
            and all(s.observation_identical and s.assistant_identical and not s.error for s in self.steps)
        )


@dataclass(frozen=True)
class RescoreReport:
    """Rewards recomputed by the env's own checker on the recorded turns, against the recorded ones."""

    index: int | None
    """Position in the run, if known."""
    episode_id: str
    """``meta.episode_id``."""
    recorded_rewards: tuple[float, ...]
    """Per-step rewards in the record."""
    replayed_rewards: tuple[float | None, ...]
    """Per-step rewards now (None where the step failed)."""
    error: str = ""
    """Why the replay could not run."""

    @property
    def recorded_reward(self) -> float:
        """Recorded episode reward."""
        return float(math.fsum(self.recorded_rewards))

    @property
    def replayed_reward(self) -> float | None:
        """Replayed episode reward (None if a step failed)."""
        if any(r is None for r in self.replayed_rewards):
            return None
        return float(math.fsum(r for r in self.replayed_rewards if r is not None))

    @property
    def matches(self) -> bool:
        """Same number of steps and the same reward at each."""
        return (
            not self.error
            and len(self.recorded_rewards) == len(self.replayed_rewards)
            and all(
                b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
                for a, b in zip(self.recorded_rewards, self.replayed_rewards, strict=True)
            )
        )

    @classmethod
    def from_reexec(cls, report: ReexecReport, traj: Trajectory) -> RescoreReport:
        """The reward part of a :class:`ReexecReport` (one replay serves both)."""
        return cls(
            report.index,
            report.episode_id,
            tuple(traj.rewards),
            tuple(s.replayed_reward for s in report.steps),
            report.error,
        )


def _msg_lines(msgs: Sequence[Message]) -> list[str]:
    return [json.dumps(m.to_dict(), ensure_ascii=False, sort_keys=True) for m in msgs]


def _diff(
    a: Sequence[str] | str, b: Sequence[str] | str, *, name_a: str = "recorded", name_b: str = "replayed"
) -> str:
    la = a.splitlines() if isinstance(a, str) else list(a)
    lb = b.splitlines() if isinstance(b, str) else list(b)
    return "\n".join(difflib.unified_diff(la, lb, fromfile=name_a, tofile=name_b, lineterm=""))


def _turn_layout(traj: Trajectory) -> tuple[int, dict[int, int]]:
    """(number of initial messages, {turn: index of its assistant message})."""
    turn_msg = {s.turn: s.message_index for s in _model_segments(traj) if s.message_index is not None}
    first = min(turn_msg.values(), default=len(traj.messages))
    return first, turn_msg


def _env_factory(
    traj: Trajectory, env_kwargs: Mapping[str, Any] | None, env_factory: Callable[[], Env] | None
) -> tuple[Callable[[], Env], str]:
    if env_factory is not None:
        return env_factory, traj.meta.env_id
    from agentrl.registry import make

    env_id = traj.meta.env_id
    if not env_id:
        raise ConfigError(f"trajectory {traj.meta.episode_id or '?'} records no env id; pass env_factory")
    kwargs = dict(env_kwargs or {})
    return (lambda: make(env_id, **kwargs)), env_id


async def areexec(
    traj: Trajectory,
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    env_factory: Callable[[], Env] | None = None,
    tokenizer: Any = None,
    index: int | None = None,
) -> ReexecReport:
    """Replay ``traj`` through a fresh env: ``reset(seed=meta.seed)``, then each recorded action in order.

    Every tool call runs again for real (the env's own tools and sandbox); its status and output are
    compared with the record, and so are the observations, the parsed assistant messages, the rewards and
    the end flags. ``env_kwargs`` are the env's constructor arguments (a run's ``config.json`` has them);
    ``env_factory`` overrides how the env is built. ``tokenizer`` is needed only for records without
    ``actions``.
    """
    actions, source = actions_of(traj, tokenizer)
    factory, env_id = _env_factory(traj, env_kwargs, env_factory)
    n_init, turn_msg = _turn_layout(traj)
    msgs = traj.messages

    def report(**kw: Any) -> ReexecReport:
        return ReexecReport(
            index=index,
            episode_id=traj.meta.episode_id,
            env_id=env_id,
            seed=traj.meta.seed,
            actions_source=source,
            recorded_end=(traj.terminated, traj.truncated),
            **kw,
        )

    def fail(msg: str) -> ReexecReport:
        return report(
            reset_identical=False, reset_diff="", steps=(), calls=(), replayed_end=(False, False), error=msg
        )

    try:
        env = factory()
    except Exception as e:
        return fail(f"building the env failed: {type(e).__name__}: {e}")
    from agentrl.env import as_step_result
    from agentrl.types import Action

    steps: list[StepReplay] = []
    calls: list[CallReplay] = []
    end = (False, False)
    try:
        try:
            obs, _info = await env.reset(seed=traj.meta.seed)
        except Exception as e:
            return fail(f"reset failed: {type(e).__name__}: {e}")
        want = _msg_lines(msgs[:n_init])
        got = _msg_lines(tuple(obs))
        reset_same = want == got
        reset_diff = "" if reset_same else _diff(want, got)
        segs = {s.turn: s for s in _model_segments(traj)}
        for k, action in enumerate(actions):
            seg = segs.get(k)
            ids = traj.token_ids[seg.start : seg.end] if seg is not None else ()
            ai = turn_msg.get(k)
            nxt = min((v for t, v in turn_msg.items() if t > k), default=len(msgs))
            rec_asst = msgs[ai] if ai is not None and ai < len(msgs) else None
            rec_obs = msgs[ai + 1 : nxt] if ai is not None else ()
            rec_reward = traj.rewards[k] if k < len(traj.rewards) else None
            rec_calls = [c for c in traj.tool_calls if c.turn == k]
            try:
                res = as_step_result(await env.step(Action(text=action, token_ids=tuple(ids))))
                new_obs, reward, term, trunc = res.observation, res.reward, res.terminated, res.truncated
            except Exception as e:
                steps.append(StepReplay(k, rec_reward, None, False, False, "", f"{type(e).__name__}: {e}"))
                calls.extend(_pair_calls(rec_calls, ()))
                break
            end = (bool(term), bool(trunc))
            asst = res.assistant_message or Message("assistant", action)
            asst_same = rec_asst is None or _msg_lines([rec_asst]) == _msg_lines([asst])
            want_o, got_o = _msg_lines(rec_obs), _msg_lines(tuple(new_obs))
            obs_same = want_o == got_o
            diff = ""
            if not (obs_same and asst_same):
                diff = _diff(
                    _msg_lines([rec_asst]) + want_o if rec_asst is not None else want_o,
                    _msg_lines([asst]) + got_o,
                )
            steps.append(StepReplay(k, rec_reward, float(reward), obs_same, asst_same, diff))
            calls.extend(_pair_calls(rec_calls, res.tool_calls))
            if term or trunc:
                break
        # Recorded calls of turns the replay never reached.
        seen = {c.call_id for c in calls}
        calls.extend(_pair_calls([c for c in traj.tool_calls if c.call_id not in seen], ()))
    finally:
        try:
            await env.close()
        except Exception:  # closing is best effort; the report is what matters
            pass
    return report(
        reset_identical=reset_same,
        reset_diff=reset_diff,
        steps=tuple(steps),
        calls=tuple(calls),
        replayed_end=end,
    )


def _pair_calls(recorded: Sequence[ToolRecord], replayed: Sequence[ToolRecord]) -> list[CallReplay]:
    out: list[CallReplay] = []
    by_id = {r.call_id: r for r in replayed}
    used: set[str] = set()
    for j, rec in enumerate(recorded):
        new = by_id.get(rec.call_id)
        if new is None and j < len(replayed) and replayed[j].call_id not in {r.call_id for r in recorded}:
            new = replayed[j]  # ids differ (an env that numbers calls itself); pair by position
        if new is None:
            out.append(
                CallReplay(
                    rec.call_id, rec.name, rec.turn, "missing", rec.status.value, None, rec.output, None
                )
            )
            continue
        used.add(new.call_id)
        same = new.status is rec.status and new.output == rec.output and new.name == rec.name
        diff = ""
        if not same:
            diff = _diff(
                [f"status: {rec.status.value}", *rec.output.splitlines()],
                [f"status: {new.status.value}", *new.output.splitlines()],
            )
        out.append(
            CallReplay(
                rec.call_id,
                rec.name,
                rec.turn,
                "identical" if same else "different",
                rec.status.value,
                new.status.value,
                rec.output,
                new.output,
                diff,
            )
        )
    for new in replayed:
        if new.call_id not in used and new.call_id not in {r.call_id for r in recorded}:
            out.append(
                CallReplay(new.call_id, new.name, new.turn, "extra", None, new.status.value, None, new.output)
            )
    return out


def reexec(traj: Trajectory, **kwargs: Any) -> ReexecReport:
    """Synchronous :func:`areexec` (works inside a running event loop too, e.g. a notebook)."""
    from agentrl._sync import run_sync

    return run_sync(areexec(traj, **kwargs))


async def arescore(traj: Trajectory, **kwargs: Any) -> RescoreReport:
    """Replay ``traj`` (as :func:`areexec`) and compare the env's rewards with the recorded ones."""
    return RescoreReport.from_reexec(await areexec(traj, **kwargs), traj)


def rescore(traj: Trajectory, **kwargs: Any) -> RescoreReport:
    """Synchronous :func:`arescore`."""
    from agentrl._sync import run_sync

    return run_sync(arescore(traj, **kwargs))


async def areexec_many(
    trajectories: Sequence[Trajectory],
    *,
    indices: Sequence[int] | None = None,
    concurrency: int = 4,
    **kwargs: Any,
) -> list[ReexecReport]:
    """:func:`areexec` over many trajectories, ``concurrency`` envs at a time, in input order."""
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    sem = asyncio.Semaphore(concurrency)
    idx = list(indices) if indices is not None else list(range(len(trajectories)))

    async def one(i: int, t: Trajectory) -> ReexecReport:
        async with sem:
            return await areexec(t, index=i, **kwargs)

    return list(await asyncio.gather(*(one(i, t) for i, t in zip(idx, trajectories, strict=True))))


# =====================================================================================================
# Recompute log-probs and Σπ² (training-inference mismatch)
# =====================================================================================================
@dataclass(frozen=True)
class TokenDiff:
    """One sampled token whose recomputed log-prob differs from the recorded one."""

    index: int | None
    """Trajectory position in the run."""
    episode_id: str
    """``meta.episode_id``."""
    token_index: int
    """Position in the trajectory's token stream."""
    token_id: int
    """The token."""
    text: str
    """Its text ('' without a tokenizer)."""
    recorded: float
    """Sampler log-prob (recorded)."""
    recomputed: float
    """Log-prob from one forward pass over the recorded tokens."""
    sum_pi_squared: float
    """Σπ² of the recomputed distribution at this position."""

    @property
    def abs_diff(self) -> float:
        """|recorded − recomputed|."""
        return abs(self.recorded - self.recomputed)


@dataclass(frozen=True)
class TrajectoryRecompute:
    """Recomputed per-token values of one trajectory (aligned with its tokens; None off the model tokens)."""

    index: int | None
    """Trajectory position in the run."""
    episode_id: str
    """``meta.episode_id``."""
    weights: str
    """Which weights scored it."""
    logprobs: tuple[float | None, ...]
    """Recomputed log π of each sampled token."""
    sum_pi_squared: tuple[float | None, ...]
    """Σπ² at each sampled token."""
    max_abs_diff: float
    """Largest |recorded − recomputed| over its sampled tokens (0 if none)."""
    mean_abs_diff: float
    """Mean |recorded − recomputed| over its sampled tokens."""
    worst_token: int | None
    """Token index of the largest difference."""


@dataclass(frozen=True)
class RecomputeReport:
    """Recorded sampler log-probs against one forward pass over the recorded tokens."""

    trajectories: tuple[TrajectoryRecompute, ...]
    """Per trajectory, in input order."""
    largest: tuple[TokenDiff, ...]
    """The sampled tokens with the largest differences, largest first."""
    tokens: int
    """Sampled tokens compared."""
    max_abs_diff: float
    """Largest difference over all of them."""
    mean_abs_diff: float
    """Mean difference."""
    mean_sum_pi_squared: float
    """Mean Σπ² over the sampled tokens."""
    temperature: float
    """Temperature of the recomputed distribution (the run's)."""

    def exceeding(self, tol: float) -> int:
        """Trajectories whose largest difference exceeds ``tol``."""
        return sum(1 for t in self.trajectories if t.max_abs_diff > tol)


def _score_one(
    model: Any, traj: Trajectory, temperature: float, chunk_size: int
) -> tuple[list[float], list[float]]:
    import torch

    from agentrl.learner import forward_logprobs

    dev = next(model.parameters()).device
    ids = torch.tensor([list(traj.token_ids)], dtype=torch.long, device=dev)
    mask = torch.tensor([list(traj.loss_mask)], dtype=torch.float32, device=dev)
    with torch.no_grad():
        out = forward_logprobs(
            model,
            ids,
            torch.ones_like(ids),
            temperature=temperature,
            chunk_size=chunk_size,
            with_sum_pi_squared=True,
            token_mask_B_T=mask,
        )
    assert out.sum_pi_squared_B_T is not None
    return out.logprobs_B_T[0].float().tolist(), out.sum_pi_squared_B_T[0].float().tolist()


def recompute(
    trajectories: Sequence[Trajectory],
    model: Any,
    *,
    tokenizer: Any = None,
    temperature: float = 1.0,
    indices: Sequence[int] | None = None,
    top: int = 10,
    chunk_size: int = 1024,
    weights: str = "",
    device: str | None = None,
) -> RecomputeReport:
    """Recompute log π and Σπ² of every sampled token with ``model`` (a module or a model folder) and
    compare with the recorded sampler log-probs; ``largest`` lists the ``top`` worst tokens."""
    if isinstance(model, str | os.PathLike):
        from agentrl.models import load_model

        path = Path(model)
        if (path / "model").is_dir():
            path = path / "model"
        weights = weights or str(path)
        model = load_model(path, device=device or "cpu")
    label = weights or type(model).__name__
    return _recompute_with(
        lambda _t: (model, label),
        trajectories,
        tokenizer=tokenizer,
        temperature=temperature,
        indices=indices,
        top=top,
        chunk_size=chunk_size,
    )


def recompute_run(
    run: Run,
    *,
    indices: Sequence[int] | None = None,
    model: Any = None,
    tokenizer: Any = None,
    top: int = 10,
    device: str | None = None,
    dtype: str | None = None,
) -> RecomputeReport:
    """:func:`recompute` for a run: each trajectory is scored by the weights that sampled it
    (``checkpoints/step-<policy_version>``) at the run's temperature, unless ``model`` is given."""
    idx = list(indices) if indices is not None else list(range(len(run.trajectories)))
    trajs = [run.trajectories[i] for i in idx]
    temperature = float(run.setting("learner.temperature", run.setting("rollout.temperature", 1.0)))
    if tokenizer is None:
        tokenizer = load_tokenizer_for(run)
    if model is not None:
        return recompute(
            trajs, model, tokenizer=tokenizer, temperature=temperature, indices=idx, top=top, device=device
        )
    cache: dict[int, tuple[Any, str]] = {}

    def pick(t: Trajectory) -> tuple[Any, str]:
        v = t.meta.policy_version
        if v not in cache:
            cache.clear()  # one model in memory at a time
            cache[v] = load_weights(run, v, device=device, dtype=dtype)
        return cache[v]

    order = sorted(range(len(trajs)), key=lambda k: trajs[k].meta.policy_version)
    rep = _recompute_with(
        pick,
        [trajs[k] for k in order],
        tokenizer=tokenizer,
        temperature=temperature,
        indices=[idx[k] for k in order],
        top=top,
        chunk_size=1024,
    )
    # Back to the caller's order.
    pos = {k: j for j, k in enumerate(order)}
    return dataclasses.replace(rep, trajectories=tuple(rep.trajectories[pos[k]] for k in range(len(trajs))))


def _recompute_with(
    pick: Callable[[Trajectory], tuple[Any, str]],
    trajectories: Sequence[Trajectory],
    *,
    tokenizer: Any,
    temperature: float,
    indices: Sequence[int] | None,
    top: int,
    chunk_size: int,
) -> RecomputeReport:
    if indices is not None and len(indices) != len(trajectories):
        raise ConfigError("indices must have one entry per trajectory")
    tx = _text(tokenizer)
    per: list[TrajectoryRecompute] = []
    diffs: list[TokenDiff] = []
    total = 0
    sum_abs = 0.0
    sum_spi2 = 0.0
    for k, traj in enumerate(trajectories):
        index = indices[k] if indices is not None else k
        n_tok = len(traj.token_ids)
        if len(traj.loss_mask) != n_tok or len(traj.logprobs) != n_tok:
            raise AuditError(
                f"trajectory {index}: {n_tok} ids, {len(traj.loss_mask)} mask entries, {len(traj.logprobs)} "
                "log-probs; the columns do not line up (replay.check says where)"
            )
        model, weights = pick(traj)
        lps: list[float | None] = [None] * len(traj.token_ids)
        sps: list[float | None] = [None] * len(traj.token_ids)
        worst, worst_i, s_abs, n = 0.0, None, 0.0, 0
        if traj.num_model_tokens and len(traj.token_ids) > 1:
            lp_all, sp_all = _score_one(model, traj, temperature, chunk_size)
            for i, (mk, rec) in enumerate(zip(traj.loss_mask, traj.logprobs, strict=True)):
                if mk != 1 or i == 0:
                    continue
                lps[i], sps[i] = lp_all[i], sp_all[i]
                if rec is None:
                    continue
                d = abs(rec - lp_all[i])
                n += 1
                s_abs += d
                sum_spi2 += sp_all[i]
                if d > worst or worst_i is None:
                    worst, worst_i = d, i
                tid = traj.token_ids[i]
                diffs.append(
                    TokenDiff(
                        index,
                        traj.meta.episode_id,
                        i,
                        tid,
                        tx.token(tid) if tx else "",
                        rec,
                        lp_all[i],
                        sp_all[i],
                    )
                )
            if len(diffs) > 4 * max(top, 1):
                diffs.sort(key=lambda d: -d.abs_diff)
                del diffs[max(top, 1) :]
        total += n
        sum_abs += s_abs
        per.append(
            TrajectoryRecompute(
                index,
                traj.meta.episode_id,
                weights,
                tuple(lps),
                tuple(sps),
                worst,
                s_abs / n if n else 0.0,
                worst_i,
            )
        )
    diffs.sort(key=lambda d: -d.abs_diff)
    return RecomputeReport(
        tuple(per),
        tuple(diffs[: max(top, 0)]),
        total,
        max((t.max_abs_diff for t in per), default=0.0),
        sum_abs / total if total else 0.0,
        sum_spi2 / total if total else 0.0,
        temperature,
    )


# =====================================================================================================
# Reproduce a training step
# =====================================================================================================
@dataclass(frozen=True)
class MetricCheck:
    """One metric of a step: recorded in ``metrics.jsonl`` vs recomputed now."""

    name: str
    """Metric name (``learn/loss``...)."""
    recorded: float | None
    """Value in ``metrics.jsonl`` (None: absent or non-finite)."""
    recomputed: float
    """Value recomputed from the record and the checkpoint."""
    match: bool
    """Within tolerance."""

    @property
    def abs_diff(self) -> float | None:
        """|recorded − recomputed| (None when not comparable)."""
        if self.recorded is None or not math.isfinite(self.recomputed):
            return None
        return abs(self.recorded - self.recomputed)


@dataclass(frozen=True)
class StepReport:
    """A training step recomputed from its recorded trajectories and the weights that sampled them."""

    step: int
    """The step."""
    weights: str
    """Which weights were used (checkpoint folder, or the rebuilt initial weights)."""
    estimator: str
    """Advantage estimator of the run."""
    indices: tuple[int, ...]
    """Positions (in the run) of the trajectories the step trained on, in batch order."""
    episode_ids: tuple[str, ...]
    """Their episode ids."""
    advantages: tuple[tuple[float | None, ...], ...]
    """Per trajectory, per token: the recomputed advantage (None off the model tokens)."""
    checks: tuple[MetricCheck, ...]
    """Recorded against recomputed metrics."""
    device: str
    """Where it was recomputed."""

    @property
    def matches(self) -> bool:
        """Every recorded metric was reproduced."""
        return all(c.match for c in self.checks)

    def advantages_of(self, index: int) -> tuple[float | None, ...] | None:
        """Advantages of the trajectory at run position ``index`` (None if it was not in the batch)."""
        try:
            return self.advantages[self.indices.index(index)]
        except ValueError:
            return None


def step_batch(run: Run, step: int) -> tuple[list[int], list[int]]:
    """``(all, trained)``: run positions of the step's trajectories (those the trainer counted in its
    episode metrics) and, among them, the ones it trained on (infra failures dropped), in batch order.

    The trainer uses every *complete* group of the step (a resumed step re-runs incomplete ones, whose
    leftovers stay in the file but were never trained on).
    """
    group_size = run.setting("group_size")
    members: dict[str, list[int]] = {}
    for i, t in enumerate(run.trajectories):
        if t.meta.step == step:
            members.setdefault(t.meta.group_id, []).append(i)
    if not members:
        raise ConfigError(f"no trajectory of step {step} in {run.trajectories_path}")
    keep = {g for g, ix in members.items() if group_size is None or len(ix) == int(group_size)}
    all_idx = [i for i, t in enumerate(run.trajectories) if t.meta.step == step and t.meta.group_id in keep]
    # The trainer's rows: groups in the order they completed, members in finishing order (= file order).
    pos = {id(run.trajectories[i]): i for i in all_idx}
    groups = group_trajectories(run.trajectories[i] for i in all_idx)
    trained = [pos[id(t)] for g in groups for t in g if not t.infra_failure]
    return all_idx, trained


def _pad_id(tokenizer: Any) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is not None:
        return int(pad)
    from agentrl.chat import ChatRenderer

    return int(ChatRenderer(tokenizer).stop_token_ids[0])


def _learner_for(run: Run, model: Any) -> Any:
    from agentrl.config import config_from_dict
    from agentrl.learner import Learner, LearnerConfig

    return Learner(model, config_from_dict(LearnerConfig, dict(run.setting("learner", {}) or {})))


def _per_token(adv_B_T: Any, trajs: Sequence[Trajectory]) -> tuple[tuple[float | None, ...], ...]:
    rows = adv_B_T.detach().float().cpu().tolist()
    return tuple(
        tuple(rows[b][i] if t.loss_mask[i] == 1 else None for i in range(len(t.token_ids)))
        for b, t in enumerate(trajs)
    )


def step_advantages(
    run: Run, step: int, *, device: str | None = None, dtype: str | None = None, tokenizer: Any = None
) -> dict[int, tuple[float | None, ...]]:
    """Per-token advantages of step ``step``, recomputed with the run's estimator, by run position.

    ``otb`` needs the weights that sampled the step (log π and Σπ²); the other estimators only need the
    rewards, but the same path is used so the numbers are exactly the trainer's.
    """
    if run.run_dir is None:
        raise ConfigError("advantages need a run directory (config.json says which estimator the run used)")
    _all, trained = step_batch(run, step)
    if not trained:
        return {}
    model, _ = load_weights(run, step, device=device, dtype=dtype)
    tok = tokenizer if tokenizer is not None else load_tokenizer_for(run)
    from agentrl.credit import estimator_config
    from agentrl.update import score_and_credit

    credit = score_and_credit(
        _learner_for(run, model),
        list(group_trajectories(run.trajectories[i] for i in trained)),
        estimator=estimator_config(run.setting("estimator", "otb")),
        pad_id=_pad_id(tok),
    )
    per = _per_token(credit.advantages_B_T, [run.trajectories[i] for i in trained])
    return dict(zip(trained, per, strict=True))


def _close(a: float | None, b: float, rtol: float, atol: float) -> bool:
    if a is None:
        return not math.isfinite(b)
    if not math.isfinite(b):
        return False
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)


def reproduce_step(
    run: Run,
    step: int,
    *,
    device: str | None = None,
    dtype: str | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    tokenizer: Any = None,
) -> StepReport:
    """Recompute training step ``step`` exactly as the trainer did and compare with ``metrics.jsonl``.

    From the recorded trajectories of the step (complete groups, infra failures dropped) and the weights
    that sampled them (``checkpoints/step-<step>``, or the rebuilt initial weights for step 0): collate →
    ``Learner.score`` (log π, Σπ²) → the run's advantage estimator → ``Learner.step``'s loss and gradient
    norm (before the optimizer moves anything) → the variance proxies. Raises :class:`StoreError` when the
    checkpoint was rotated away, :class:`ConfigError` when the step has no metrics or trajectories.
    """

    from agentrl.credit import estimator_config
    from agentrl.update import policy_update

    if run.run_dir is None:
        raise ConfigError(f"{run.path} is not a run directory (no config.json); --step needs one")
    row = run.metrics_row(step)
    if row is None:
        have = sorted({int(r["step"]) for r in run.metrics if "step" in r})
        raise ConfigError(f"metrics.jsonl has no row for step {step} (steps logged: {have})")
    all_idx, trained = step_batch(run, step)
    tok = tokenizer if tokenizer is not None else load_tokenizer_for(run)
    if tok is None:
        raise ConfigError("cannot tell the run's tokenizer; pass tokenizer=")
    trajs_all = [run.trajectories[i] for i in all_idx]
    ok = [t for t in trajs_all if not t.infra_failure]
    got: dict[str, float] = {
        "episodes/total": float(len(trajs_all)),
        "episodes/infra_failures": float(len(trajs_all) - len(ok)),
        "reward/mean": float(sum(t.reward for t in ok) / len(ok)) if ok else float("nan"),
    }
    weights, dev_s = "", ""
    advantages: tuple[tuple[float | None, ...], ...] = ()
    estimator = estimator_config(run.setting("estimator", "otb"))
    if trained:
        model, weights = load_weights(run, step, device=device, dtype=dtype)
        # The trainer's own update function, on the recorded episodes and the weights that sampled them.
        learner = _learner_for(run, model)
        groups = list(group_trajectories(run.trajectories[i] for i in trained))
        update = policy_update(learner, groups, estimator=estimator, pad_id=_pad_id(tok))
        dev_s = str(learner.device)
        got.update(update.metrics)
        advantages = _per_token(update.credit.advantages_B_T, [run.trajectories[i] for i in trained])
    checks = []
    for name, value in got.items():
        if name not in row:
            continue
        rec = row[name]
        rec_f = None if rec is None else float(rec)
        checks.append(MetricCheck(name, rec_f, float(value), _close(rec_f, float(value), rtol, atol)))
    return StepReport(
        step,
        weights or "(no trajectory to train on)",
        str(estimator),
        tuple(trained),
        tuple(run.trajectories[i].meta.episode_id for i in trained),
        advantages,
        tuple(checks),
        dev_s,
    )


# =====================================================================================================
# Terminal rendering
# =====================================================================================================
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
    tx = _text(tokenizer)
    m = traj.meta
    out: list[str] = []
    head = f"trajectory {index}" if index is not None else "trajectory"
    out.append(st(f"{head}  episode {m.episode_id or '?'}", "1"))
    out.append(
        f"  env {m.env_id or '?'}  task {m.task_id or '?'}  seed {m.seed}  step {m.step}"
        f"  group {m.group_id[:12]}  policy v{m.policy_version}"
    )
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
    for e in traj.errors:
        out.append(
            st(f"  ERROR {e.kind} (turn {e.turn}, {'infra' if e.infra else 'episode'}): {e.message}", "31")
        )

    records = {r.call_id: r for r in traj.tool_calls}
    turn_of_msg = {s.message_index: s for s in _model_segments(traj) if s.message_index is not None}
    n_init, _ = _turn_layout(traj)
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
        for s in _model_segments(traj):
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


def _num(x: float | None, w: int) -> str:
    return f"{'-':>{w}}" if x is None else f"{x:{w}.4f}"


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n] + f"... [{len(s) - n} more chars]"


# =====================================================================================================
# HTML
# =====================================================================================================
def write_html(
    run: Run | Sequence[Trajectory],
    out: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    indices: Sequence[int] | None = None,
    advantages: Mapping[int, Sequence[float | None]] | None = None,
    recomputed: RecomputeReport | None = None,
    title: str | None = None,
    max_trajectories: int = 2000,
) -> Path:
    """Write one self-contained HTML page (inline CSS, JS and data; no network) to browse trajectories:
    a filterable list, the transcript, tool calls, and the token stream coloured by provenance/mask,
    log-prob, advantage or recompute difference, with per-token details on hover.

    ``indices`` picks run positions (default: all; at most ``max_trajectories``); ``advantages`` maps a run
    position to per-token values (:func:`step_advantages`); ``recomputed`` adds recomputed log-probs and Σπ²
    (:func:`recompute_run`).
    """
    from agentrl.replay_html import render_page

    if isinstance(run, Run):
        trajs = run.trajectories
        source = str(run.path)
        if tokenizer is None:
            tokenizer = load_tokenizer_for(run)
    else:
        trajs = tuple(run)
        source = ""
    idx = list(indices) if indices is not None else list(range(len(trajs)))
    if len(idx) > max_trajectories:
        # Every token of every episode is embedded; past a few thousand episodes the page gets too big
        # for a browser to be useful.
        raise ConfigError(
            f"{len(idx)} trajectories for one page (limit {max_trajectories}): select fewer (filters such "
            "as --step, --limit) or raise max_trajectories"
        )
    tx = _text(tokenizer)
    rec_by_index = {t.index: t for t in recomputed.trajectories} if recomputed is not None else {}
    vocab: dict[int, str] = {}
    items = []
    for i in idx:
        t = trajs[i]
        if tx is not None:
            for tid in set(t.token_ids):
                if tid not in vocab:
                    vocab[tid] = tx.token(tid)
        adv = advantages.get(i) if advantages is not None else None
        rc = rec_by_index.get(i)
        items.append(_traj_payload(i, t, adv, rc))
    notes = []
    if tx is None:
        notes.append("no tokenizer: tokens are shown as ids")
    payload = {
        "title": title or (f"agentrl replay: {source}" if source else "agentrl replay"),
        "source": source,
        "notes": notes,
        "vocab": {str(k): v for k, v in vocab.items()},
        "trajectories": items,
        "has_advantages": advantages is not None,
        "has_recomputed": recomputed is not None,
    }
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(payload), encoding="utf-8")
    return path


def _r(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.7g}")  # 7 significant digits: exact enough to see a 1e-6 mismatch, half the bytes


def _traj_payload(
    i: int, t: Trajectory, adv: Sequence[float | None] | None, rc: TrajectoryRecompute | None
) -> dict[str, Any]:
    m = t.meta
    return {
        "i": i,
        "id": m.episode_id,
        "env": m.env_id,
        "task": m.task_id,
        "seed": m.seed,
        "step": m.step,
        "group": m.group_id,
        "pv": m.policy_version,
        "reward": t.reward,
        "rewards": list(t.rewards),
        "stop": t.stop_reason.value,
        "terminated": t.terminated,
        "truncated": t.truncated,
        "infra": t.infra_failure,
        "turns": t.num_turns,
        "model_tokens": t.num_model_tokens,
        "errors": [e.to_dict() for e in t.errors],
        "messages": [msg.to_dict() for msg in t.messages],
        "tools": [{k: v for k, v in r.to_dict().items()} for r in t.tool_calls],
        "actions": list(t.actions),
        "segments": [[s.source.value, s.start, s.end, s.turn, s.message_index] for s in t.segments],
        "ids": list(t.token_ids),
        "mask": list(t.loss_mask),
        "lp": [_r(x) for x in t.logprobs],
        "adv": [_r(x) for x in adv] if adv is not None else None,
        "rlp": [_r(x) for x in rc.logprobs] if rc is not None else None,
        "spi2": [_r(x) for x in rc.sum_pi_squared] if rc is not None else None,
    }
