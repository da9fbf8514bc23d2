"""Re-execute a recorded trajectory through a fresh env and compare: tool calls, observations, rewards.

Re-execution works through the ``Env`` contract alone: a fresh env (``agentrl.make(meta.env_id,
**env_kwargs)``) is reset with the recorded seed and fed the recorded actions in order; each observation,
parsed assistant message, tool record and reward is compared with the recorded one. Every tool call runs
again for real (the env's own tools and sandbox).

The end flags are compared too. An episode that the rollout itself cut (its token or turn limit, or a
template mismatch: :data:`ROLLOUT_ENDS`) is recorded truncated, but the env never saw that end: a turn
cut mid-way is never handed to ``step``, and after the last allowed turn the rollout stops without asking
the env. Its replay is therefore expected to end ``(False, False)``; any other end is a difference.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl._sync import run_sync
from agentrl.env import Env, as_step_result
from agentrl.errors import ConfigError
from agentrl.registry import make
from agentrl.replay import actions_of, model_segments, turn_layout
from agentrl.types import Action, Message, StopReason, ToolRecord, Trajectory

__all__ = [
    "ROLLOUT_ENDS",
    "CallReplay",
    "ReexecReport",
    "RescoreReport",
    "StepReplay",
    "areexec",
    "areexec_many",
    "arescore",
    "reexec",
    "rescore",
]


ROLLOUT_ENDS = frozenset(
    {StopReason.TURN_TOKENS, StopReason.MAX_TOKENS, StopReason.MAX_TURNS, StopReason.TEMPLATE_MISMATCH}
)
"""Stop reasons of episodes the rollout ended by its own limit, which the env never sees."""


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
    """``recorded`` (``Trajectory.actions``), ``decoded`` (from the model tokens) or ``none`` (no turn ended
    with a stop token, so none reached the env: only ``reset`` is replayed)."""
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
    rollout_end: str | None = None
    """The recorded stop reason when the rollout's own limit ended the episode (:data:`ROLLOUT_ENDS`)."""

    @property
    def expected_end(self) -> tuple[bool, bool]:
        """The end the replay must reach: the recorded one, or ``(False, False)`` when the rollout's own limit
        ended the episode (the env never saw that end)."""
        return (False, False) if self.rollout_end is not None else self.recorded_end

    @property
    def end_matches(self) -> bool:
        """The replay ended as expected."""
        return self.replayed_end == self.expected_end

    @property
    def different_calls(self) -> tuple[CallReplay, ...]:
        """Calls whose verdict is not ``identical``."""
        return tuple(c for c in self.calls if c.verdict != "identical")

    @property
    def ok(self) -> bool:
        """Everything replayed identically: reset, every observation, assistant message and tool call, and
        the end (:attr:`expected_end`)."""
        return (
            not self.error
            and self.reset_identical
            and self.end_matches
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


def _env_factory(
    traj: Trajectory, env_kwargs: Mapping[str, Any] | None, env_factory: Callable[[], Env] | None
) -> tuple[Callable[[], Env], str]:
    if env_factory is not None:
        return env_factory, traj.meta.env_id
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
    n_init, turn_msg = turn_layout(traj)
    msgs = traj.messages

    def report(**kw: Any) -> ReexecReport:
        return ReexecReport(
            index=index,
            episode_id=traj.meta.episode_id,
            env_id=env_id,
            seed=traj.meta.seed,
            actions_source=source,
            recorded_end=(traj.terminated, traj.truncated),
            rollout_end=traj.stop_reason.value if traj.stop_reason in ROLLOUT_ENDS else None,
            **kw,
        )

    def fail(msg: str) -> ReexecReport:
        return report(
            reset_identical=False, reset_diff="", steps=(), calls=(), replayed_end=(False, False), error=msg
        )

    m = traj.meta
    if m.sample_index > 0:
        # A later sample of a compacted (or sub-agent) episode starts from env state its earlier samples
        # built; a fresh reset cannot reach it, so a comparison would only report made-up differences.
        return fail(
            f"sample {m.sample_index} of the {m.num_samples}-sample episode {m.episode_id}: only an "
            "episode's first sample is re-executed from reset (later ones start from state the earlier "
            "samples built)"
        )
    try:
        env = factory()
    except Exception as e:
        return fail(f"building the env failed: {type(e).__name__}: {e}")
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
        segs = {s.turn: s for s in model_segments(traj)}
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
    return run_sync(areexec(traj, **kwargs))


async def arescore(traj: Trajectory, **kwargs: Any) -> RescoreReport:
    """Replay ``traj`` (as :func:`areexec`) and compare the env's rewards with the recorded ones."""
    return RescoreReport.from_reexec(await areexec(traj, **kwargs), traj)


def rescore(traj: Trajectory, **kwargs: Any) -> RescoreReport:
    """Synchronous :func:`arescore`."""
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
