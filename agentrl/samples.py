"""Episodes that outgrow one context: several token-faithful samples of one episode.

An episode is one token sequence until something replaces the model's context. Then it goes on in a new
*sample*: a separate :class:`~agentrl.types.Trajectory` with its own prompt, token-faithful in its own
context and audited on its own. The samples of one episode share ``meta.episode_id``, ``group_id`` and
``task_id``; ``meta.sample_index`` numbers them in the order they were sampled (the order each sample's
first token was sampled) and ``meta.num_samples`` says how many there are. Each sample's ``rewards`` are
its own turns' rewards; the episode's return is the sum over its samples.

Where samples come from:

* **the env compacts the context**: ``Env.step`` returns ``StepResult(compact=messages)``, a summary its
  own code wrote; the rollout ends the sample after that turn (stop reason ``compacted``) and starts the next
  one with ``messages`` as its whole prompt;
* **the policy writes the compaction**: the env asks for a summary (an observation saying so); the policy's
  next turn is sampled and trained like any other, and the env answers it with ``StepResult(compact=...)``
  holding the policy's text, which seeds the next sample;
* **a tool runs a sub-agent**: inside an episode run by :func:`run_samples`, a tool calls
  :func:`run_subagent` with an env of its own; the sub-agent is a nested episode of the same policy in a
  fresh context whose samples join the parent episode's (its rewards count toward the episode's return:
  give them 0 when only the parent's outcome should);
* **the gateway** splits a session when an agent rewrites its history (``agentrl.trainers.gateway``); its
  segments are linked the same way.

:func:`run_samples` runs one episode and returns all its samples; the scheduler
(:func:`agentrl.rollout.run_groups`) uses it, so a group holds every sample of every member.
"""

from __future__ import annotations

import contextvars
import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.env import Env
from agentrl.episode import RolloutConfig, SampleSink, run_episode
from agentrl.errors import ConfigError
from agentrl.groups import episode_returns, episodes_of  # their home; still importable from here
from agentrl.protocols import Policy
from agentrl.types import StopReason, Trajectory, TrajectoryMeta

__all__ = [
    "SampleSink",
    "SubAgentResult",
    "episode_returns",
    "episodes_of",
    "link_samples",
    "run_samples",
    "run_subagent",
]

_SUBAGENT_MEMBER_STRIDE = 100_003
"""Sub-agent k of group member m samples with the seeds of member ``m + k * stride`` (no seed is reused)."""


def link_samples(samples: Sequence[Trajectory], episode_id: str | None = None) -> tuple[Trajectory, ...]:
    """The samples of one episode, linked: one ``episode_id`` (``episode_id``, else the first sample's),
    ``sample_index`` 0, 1, ... in the given order and ``num_samples = len(samples)``.

    An infra failure in any sample makes the whole episode unusable, so it is recorded on every sample:
    training on part of an episode would credit it with a return it never had.
    """
    if not samples:
        raise ConfigError("an episode needs at least one sample")
    eid = episode_id or samples[0].meta.episode_id or uuid.uuid4().hex
    broken = next((e for t in samples for e in t.errors if e.infra), None)
    out = []
    for k, t in enumerate(samples):
        meta = dataclasses.replace(t.meta, episode_id=eid, sample_index=k, num_samples=len(samples))
        errors = t.errors
        if broken is not None and not t.infra_failure:
            why = f"another sample of the episode failed: {broken.message}"
            errors = (*errors, dataclasses.replace(broken, message=why))
        out.append(dataclasses.replace(t, meta=meta, errors=errors))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Running:
    """What :func:`run_subagent` needs of the episode it runs in (the same policy, renderer and limits)."""

    policy: Policy
    renderer: ChatRenderer
    config: RolloutConfig
    meta: TrajectoryMeta
    member: int
    sink: SampleSink


_RUNNING: contextvars.ContextVar[_Running | None] = contextvars.ContextVar("agentrl_episode", default=None)


async def run_samples(
    env: Env,
    policy: Policy,
    renderer: ChatRenderer,
    config: RolloutConfig | None = None,
    *,
    seed: int | None = None,
    meta: TrajectoryMeta | None = None,
    options: dict[str, Any] | None = None,
    member: int = 0,
) -> tuple[Trajectory, ...]:
    """Run one episode of ``env`` and return all its samples, linked (:func:`link_samples`), in the order
    they were sampled. One sample unless the env compacts the context or a tool runs a sub-agent.

    Arguments and errors as :func:`agentrl.episode.run_episode`.
    """
    cfg = config or RolloutConfig()
    base = meta or TrajectoryMeta()
    base = dataclasses.replace(base, episode_id=base.episode_id or uuid.uuid4().hex)
    sink = SampleSink()
    token = _RUNNING.set(_Running(policy, renderer, cfg, base, member, sink))
    try:
        await run_episode(
            env, policy, renderer, cfg, seed=seed, meta=base, options=options, member=member, samples=sink
        )
    finally:
        _RUNNING.reset(token)
    return link_samples(sink.samples(), base.episode_id)


@dataclass(frozen=True, slots=True)
class SubAgentResult:
    """How a sub-agent's episode ended, for the tool that ran it."""

    answer: str
    """The content of the sub-agent's last assistant message (its final answer, or where it stopped)."""
    reward: float
    """The sub-agent's return (the sum over its samples; it counts toward the parent episode's return)."""
    stop_reason: StopReason
    """Why its last sample ended."""
    samples: int
    """How many samples it produced (they joined the parent episode's)."""
    infra_failure: bool
    """The machinery failed under the sub-agent: the parent episode will not be trained on."""


async def run_subagent(
    env: Env, *, seed: int | None = None, options: dict[str, Any] | None = None
) -> SubAgentResult:
    """Run a sub-agent: a nested episode of ``env`` with the running episode's policy, in a context of its
    own. Its samples join the running episode's (after the sample that called it). Call it from a tool
    inside an episode run by :func:`run_samples`; ``env`` belongs to the caller (not closed here).

    Raises:
        ConfigError: no episode is running here (not called from within :func:`run_samples`).
    """
    running = _RUNNING.get()
    if running is None:
        raise ConfigError(
            "run_subagent runs a nested episode of the running one: call it from a tool of an episode run "
            "by agentrl.samples.run_samples (the trainer's scheduler does)"
        )
    running.sink.subagents += 1
    member = running.member + running.sink.subagents * _SUBAGENT_MEMBER_STRIDE
    meta = dataclasses.replace(
        running.meta, extra={**running.meta.extra, "subagent_env": env.spec_id or type(env).__name__}
    )
    sink = SampleSink(parent=running.sink)
    token = _RUNNING.set(dataclasses.replace(running, meta=meta, member=member, sink=sink))
    try:
        last = await run_episode(
            env,
            running.policy,
            running.renderer,
            running.config,
            seed=seed,
            meta=meta,
            options=options,
            member=member,
            samples=sink,
        )
    finally:
        _RUNNING.reset(token)
    mine = sink.samples()
    answer = next((m.content for m in reversed(last.messages) if m.role == "assistant"), "")
    return SubAgentResult(
        answer=answer,
        reward=sum(t.reward for t in mine),
        stop_reason=last.stop_reason,
        samples=len(mine),
        infra_failure=any(t.infra_failure for t in mine),
    )
