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
import dataclasses
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
    "AGENT_RECORD",
    "NO_ENV_KWARGS",
    "ROLLOUT_ENDS",
    "CallReplay",
    "ReexecReport",
    "RescoreReport",
    "StepReplay",
    "areexec",
    "areexec_episode",
    "areexec_many",
    "arescore",
    "reexec",
    "reexec_status",
    "rescore",
]


AGENT_RECORD = (
    "an agent drove this episode through the gateway (agentrl gateway, train --agent): the agent ran its own "
    "tools and computed its own reward, outside any env, so there is no Env.step to run again (--env was "
    "only its task source). Check what the run did record instead: --check (token fidelity), --recompute "
    "(the sampler's log-probs against the weights), --step N (the update); to test the agent, run it again "
    "(agentrl train --agent ... --steps 1) or evaluate its checkpoint"
)
"""Why a gateway record (``meta.extra["session_id"]``) is not re-executed."""

ROLLOUT_ENDS = frozenset(
    {
        StopReason.TURN_TOKENS,
        StopReason.MAX_TOKENS,
        StopReason.MAX_TURNS,
        StopReason.TEMPLATE_MISMATCH,
        StopReason.DEADLINE,  # the episode's deadline cut it: the env never saw an end
    }
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
    recorded_compacted: bool = False
    """The record's sample ended by compaction (``stop_reason`` ``compacted``: the episode went on in the
    next sample)."""
    replayed_compacted: bool = False
    """The replay's last step compacted the context."""
    not_reexecutable: str = ""
    """Why this record cannot be re-executed at all, by design (not a difference, not a failure): e.g. a
    later sample whose earlier samples are not in the file, or an agent run's record."""

    @property
    def expected_end(self) -> tuple[bool, bool]:
        """The end the replay must reach: the recorded one, or ``(False, False)`` when the rollout's own limit
        ended the episode (the env never saw that end)."""
        return (False, False) if self.rollout_end is not None else self.recorded_end

    @property
    def end_matches(self) -> bool:
        """The replay ended as expected (and compacted where the record did)."""
        return self.replayed_end == self.expected_end and self.replayed_compacted == self.recorded_compacted

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
            and not self.not_reexecutable
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
    not_reexecutable: str = ""
    """Why the record cannot be re-executed by design (:attr:`ReexecReport.not_reexecutable`)."""

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
            report.not_reexecutable,
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
    ``actions``. A later sample of a multi-sample episode needs the samples before it
    (:func:`areexec_episode`); alone it is reported ``not_reexecutable``.
    """
    m = traj.meta
    if m.extra.get("session_id") is not None:
        return _unreplayed(traj, index, m.env_id, not_reexecutable=AGENT_RECORD)
    if m.sample_index > 0:
        _, env_id = _env_factory(traj, env_kwargs, env_factory)
        return _unreplayed(
            traj,
            index,
            env_id,
            not_reexecutable=f"sample {m.sample_index} of the {m.num_samples}-sample episode "
            f"{m.episode_id[:12]} starts from the context its earlier samples built; re-execute the whole "
            "episode (areexec_episode, or agentrl replay RUN --reexec, which does)",
        )
    reports = await areexec_episode(
        [traj], env_kwargs=env_kwargs, env_factory=env_factory, tokenizer=tokenizer, indices=[index]
    )
    return reports[0]


def _unreplayed(
    traj: Trajectory, index: int | None, env_id: str, *, error: str = "", not_reexecutable: str = ""
) -> ReexecReport:
    """The report of a record that was not replayed (``error``: it failed; else why it cannot be)."""
    return ReexecReport(
        index=index,
        episode_id=traj.meta.episode_id,
        env_id=env_id,
        seed=traj.meta.seed,
        actions_source="none",
        reset_identical=False,
        reset_diff="",
        steps=(),
        calls=(),
        recorded_end=(traj.terminated, traj.truncated),
        replayed_end=(False, False),
        error=error,
        rollout_end=traj.stop_reason.value if traj.stop_reason in ROLLOUT_ENDS else None,
        recorded_compacted=traj.stop_reason is StopReason.COMPACTED,
        not_reexecutable=not_reexecutable,
    )


async def areexec_episode(
    samples: Sequence[Trajectory],
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    env_factory: Callable[[], Env] | None = None,
    tokenizer: Any = None,
    indices: Sequence[int | None] | None = None,
) -> list[ReexecReport]:
    """Re-execute an episode's samples 0, 1, ... in order through one env, one report per sample.

    Sample 0 starts from ``reset``; each later sample from the context the env compacted to at the end of
    the sample before it (``StepResult.compact``: the env's own summary, or the policy's recorded summary
    turn handed back as an action), which is compared with the sample's recorded start like a reset. A sample
    that follows anything but a compaction (a sub-agent's) is reported ``not_reexecutable``.
    """
    idx = list(indices) if indices is not None else [None] * len(samples)
    factory, env_id = _env_factory(samples[0], env_kwargs, env_factory)

    def rest(j: int, **why: str) -> list[ReexecReport]:
        return [_unreplayed(t, i, env_id, **why) for t, i in zip(samples[j:], idx[j:], strict=True)]

    try:
        env = factory()
    except Exception as e:
        return rest(0, error=f"building the env failed: {type(e).__name__}: {e}")
    reports: list[ReexecReport] = []
    try:
        try:
            obs, _info = await env.reset(seed=samples[0].meta.seed)
        except Exception as e:
            return rest(0, error=f"reset failed: {type(e).__name__}: {e}")
        start: tuple[Message, ...] | None = tuple(obs)
        fed = 0  # actions handed to the env so far: its turn numbers (a tool record's ``turn``) go on
        for j, traj in enumerate(samples):
            if start is None:
                prev = samples[j - 1]
                if prev.stop_reason is not StopReason.COMPACTED:
                    return reports + rest(
                        j,
                        not_reexecutable=f"sample {j} follows a sample that ended {prev.stop_reason.value}, "
                        "not by compaction (a sub-agent's context): it has no env state to start from",
                    )
                return reports + rest(
                    j,
                    error=f"the replay of sample {j - 1} did not compact where the record did, so sample "
                    f"{j} has no context to start from (see sample {j - 1}'s differences)",
                )
            report, start = await _replay_sample(env, traj, start, env_id, tokenizer, idx[j], fed)
            reports.append(report)
            fed += len(report.steps)
    finally:
        try:
            await env.close()
        except Exception:  # closing is best effort; the report is what matters
            pass
    return reports


async def _replay_sample(
    env: Env,
    traj: Trajectory,
    start: Sequence[Message],
    env_id: str,
    tokenizer: Any,
    index: int | None,
    turn_offset: int = 0,
) -> tuple[ReexecReport, tuple[Message, ...] | None]:
    """Feed one sample's actions to ``env``, which is at the sample's start (``start``: what it showed;
    ``turn_offset``: the turns of the episode's earlier samples, which its tool records count on from).
    Returns the report and the context the env compacted to at the end (None: it did not compact)."""
    actions, source = actions_of(traj, tokenizer)
    n_init, turn_msg = turn_layout(traj)
    msgs = traj.messages
    steps: list[StepReplay] = []
    calls: list[CallReplay] = []
    end = (False, False)
    compact: tuple[Message, ...] | None = None
    want = _msg_lines(msgs[:n_init])
    got = _msg_lines(tuple(start))
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
        rec_calls = [c for c in traj.tool_calls if c.turn == k + turn_offset]
        try:
            res = as_step_result(await env.step(Action(text=action, token_ids=tuple(ids))))
            reward, term, trunc = res.reward, res.terminated, res.truncated
        except Exception as e:
            steps.append(StepReplay(k, rec_reward, None, False, False, "", f"{type(e).__name__}: {e}"))
            calls.extend(_pair_calls(rec_calls, ()))
            break
        # A compaction ends the sample: the rollout shows no observation, the next sample starts from it.
        new_obs = res.observation if res.compact is None else ()
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
        if res.compact is not None:
            compact = tuple(res.compact)
            break
    # Recorded calls of turns the replay never reached.
    seen = {c.call_id for c in calls}
    calls.extend(_pair_calls([c for c in traj.tool_calls if c.call_id not in seen], ()))
    report = ReexecReport(
        index=index,
        episode_id=traj.meta.episode_id,
        env_id=env_id,
        seed=traj.meta.seed,
        actions_source=source,
        reset_identical=reset_same,
        reset_diff=reset_diff,
        steps=tuple(steps),
        calls=tuple(calls),
        recorded_end=(traj.terminated, traj.truncated),
        replayed_end=end,
        rollout_end=traj.stop_reason.value if traj.stop_reason in ROLLOUT_ENDS else None,
        recorded_compacted=traj.stop_reason is StopReason.COMPACTED,
        replayed_compacted=compact is not None,
    )
    return report, compact


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
    pool: Sequence[Trajectory] | None = None,
    **kwargs: Any,
) -> list[ReexecReport]:
    """:func:`areexec` over many trajectories, ``concurrency`` envs at a time, in input order.

    A sample of a multi-sample episode is re-executed with the samples before it, taken from ``pool`` (the
    whole file; default ``trajectories``), through one env (:func:`areexec_episode`); each episode runs
    once however many of its samples were asked for. One whose earlier samples are not there is reported
    ``not_reexecutable``.
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    sem = asyncio.Semaphore(concurrency)
    idx = list(indices) if indices is not None else list(range(len(trajectories)))
    everything = list(pool) if pool is not None else list(trajectories)
    by_episode: dict[str, dict[int, Trajectory]] = {}
    for t in everything:
        if t.meta.num_samples > 1 and t.meta.episode_id:
            by_episode.setdefault(t.meta.episode_id, {})[t.meta.sample_index] = t
    episodes: dict[str, asyncio.Future[list[ReexecReport]]] = {}

    async def chain(episode_id: str) -> list[ReexecReport]:
        known = by_episode[episode_id]
        prefix = 0  # the samples 0..prefix-1 are all there
        while prefix in known:
            prefix += 1
        if prefix == 0:
            return []
        async with sem:
            return await areexec_episode([known[k] for k in range(prefix)], **kwargs)

    async def one(i: int, t: Trajectory) -> ReexecReport:
        m = t.meta
        if m.num_samples > 1 and m.episode_id in by_episode and m.extra.get("session_id") is None:
            if m.episode_id not in episodes:
                episodes[m.episode_id] = asyncio.ensure_future(chain(m.episode_id))
            reports = await episodes[m.episode_id]
            if m.sample_index < len(reports):
                return dataclasses.replace(reports[m.sample_index], index=i)
            _, env_id = _env_factory(t, kwargs.get("env_kwargs"), kwargs.get("env_factory"))
            have = sorted(by_episode[m.episode_id])
            return _unreplayed(
                t,
                i,
                env_id,
                not_reexecutable=f"sample {m.sample_index} of episode {m.episode_id[:12]} needs its samples "
                f"0..{m.sample_index - 1}, but the file holds samples {have}",
            )
        async with sem:
            return await areexec(t, index=i, **kwargs)

    return list(await asyncio.gather(*(one(i, t) for i, t in zip(idx, trajectories, strict=True))))


NO_ENV_KWARGS = (
    "note: a trajectories file outside a run directory records the env's id but not the arguments it was "
    "built with (a run's config.json has them); if the env was made with settings in Python "
    "(agentrl.make(id, k=...), MyEnv(k=...)), pass them: --env-kwargs '{\"k\": ...}'"
)


def reexec_status(reports: Sequence[ReexecReport]) -> int:
    """``--reexec``'s exit status: 1 when a replay differed or failed, else 3 when some record cannot be
    re-executed by design (nothing differed, nothing was checked there either), else 0."""
    if any(not r.ok and not r.not_reexecutable for r in reports):
        return 1
    return 3 if any(r.not_reexecutable for r in reports) else 0
