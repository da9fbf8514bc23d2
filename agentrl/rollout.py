"""Groups of episodes, many at once: the one scheduler.

* :func:`run_group` runs ``group_size`` episodes of one task (every env reset with the same seed)
  concurrently and returns them as a :class:`~agentrl.groups.TrajectoryGroup`.
* :func:`run_groups` runs one group per seed with at most ``concurrency`` episodes in flight and yields an
  :class:`EpisodeDone` for every episode the moment it finishes (so a caller can store it at once: a crash
  loses nothing); the event of the episode that completes its group also carries the whole group (so a
  trainer can assign credit group by group). One stream, one code path, both granularities.
* :func:`schedule_groups` is the scheduler under :func:`run_groups`, for any :data:`EpisodeFn` (what runs one
  episode: a native env episode, a gateway session, a Ray worker's episode on its inference servers), with an
  episode limit a caller may share between calls.
* :func:`collect` drives :func:`run_groups` into a store and returns the groups.

A ``finish_group`` hook (:data:`GroupHook`, e.g. a group-wise judge: :class:`agentrl.rewards.RelativeReward`)
sees each group once all its members finished, before any of them is reported: it may add reward terms to
the members (RULER-style relative judging). The group's trajectories are then reported together, so the
store and the credit see the judged rewards; a member still running when the process dies is lost with its
group (without a hook each is reported the moment it ends). A hook that raises an
:class:`~agentrl.errors.InfraError` (a judge outage) makes every member an infrastructure failure (recorded,
never trained on, never rewarded 0).

One episode is :func:`agentrl.episode.run_episode`; its settings are :class:`~agentrl.episode.RolloutConfig`
(both re-exported here).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from agentrl.chat import ChatRenderer
from agentrl.env import Env
from agentrl.episode import RolloutConfig, infra_stop_reason, run_episode
from agentrl.errors import ConfigError, InfraError
from agentrl.groups import TrajectoryGroup
from agentrl.protocols import Policy, TrajectoryStore
from agentrl.samples import run_samples
from agentrl.types import EpisodeFailure, Trajectory, TrajectoryMeta

__all__ = [
    "EnvSource",
    "EpisodeDone",
    "EpisodeFn",
    "GroupHook",
    "RolloutConfig",
    "collect",
    "env_episodes",
    "group_meta",
    "run_episode",
    "run_group",
    "run_groups",
    "schedule_groups",
    "task_id",
]

EnvSource = str | Callable[[], Env]
"""A registered env id (built with :func:`agentrl.make`) or a zero-argument factory returning an Env."""


@dataclass(frozen=True, slots=True)
class EpisodeDone:
    """One finished episode, as :func:`run_groups` reports it."""

    trajectory: Trajectory
    """The episode."""
    group: TrajectoryGroup | None = None
    """The whole group when this episode was the last of its group to finish, else ``None``."""


def _env_factory(env: EnvSource) -> tuple[Callable[[], Env], str]:
    """``(factory, env id)`` for an :data:`EnvSource`; an unknown id fails here, before any episode runs."""
    if isinstance(env, str):
        from agentrl.registry import make, spec

        spec(env)  # fail early with EnvNotFoundError
        return (lambda: make(env)), env
    if callable(env):
        return env, ""
    raise ConfigError(f"env must be a registered id or a factory returning an Env, got {env!r}")


def _check_group_size(group_size: object) -> int:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ConfigError(f"group_size must be a positive int, got {group_size!r}")
    return group_size


def task_id(env_id: str, seed: int) -> str:
    """The id of the task of ``seed`` in ``env_id`` (``"<env id>:<seed>"``), shared by a group's members: the
    one place it is built (the trainer's resume matches groups on disk by it)."""
    return f"{env_id or 'env'}:{seed}"


def group_meta(base: TrajectoryMeta | None, env_id: str, seed: int) -> TrajectoryMeta:
    """The identity every member of the group of ``seed`` shares: ``base`` (its fields win when set) with
    the env id, the seed, :func:`task_id` and a fresh group id."""
    m = base or TrajectoryMeta()
    env = m.env_id or env_id
    return dataclasses.replace(
        m,
        env_id=env,
        seed=m.seed if m.seed is not None else seed,
        task_id=m.task_id or task_id(env, seed),
        group_id=m.group_id or uuid.uuid4().hex,
    )


EpisodeFn = Callable[[int, int, TrajectoryMeta], Awaitable[Sequence[Trajectory]]]
"""What runs one episode for :func:`schedule_groups`: ``(task seed, member index, the group's meta) ->`` the
episode's trajectories (one for an env episode; a gateway session the agent split may give several). Infra
failures inside the episode are its trajectories' business; what it raises stops the whole schedule."""


GroupHook = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup]]
"""What a complete group goes through before its members are reported (``finish_group`` of
:func:`schedule_groups`): the same trajectories, in the same order, with rewards and reward terms it may
change (tokens, masks and identity it must keep). Raising an :class:`~agentrl.errors.InfraError` fails the
whole group as infrastructure; anything else stops the schedule."""


def _finished_group(before: TrajectoryGroup, after: object) -> TrajectoryGroup:
    """``after`` checked against ``before``: a hook may rescore members, never swap or edit their tokens."""
    if not isinstance(after, TrajectoryGroup) or len(after) != len(before):
        raise ConfigError(
            f"a finish_group hook must return the group's {len(before)} trajectories, got {after!r:.80}"
        )
    for a, b in zip(before, after, strict=True):
        same = (a.meta.episode_id, a.meta.sample_index) == (b.meta.episode_id, b.meta.sample_index)
        if not same or a.token_ids != b.token_ids:
            raise ConfigError("a finish_group hook must keep each member's identity, order and tokens")
    return after


def _failed_group(group: TrajectoryGroup, e: InfraError) -> TrajectoryGroup:
    """Every member of ``group`` as an infrastructure failure of its hook (a judge outage): recorded with the
    error, dropped from training like a sandbox failure, never scored."""
    reason = infra_stop_reason(e)
    return TrajectoryGroup(
        tuple(
            dataclasses.replace(
                t,
                stop_reason=reason,
                errors=(*t.errors, EpisodeFailure(type(e).__name__, str(e), t.num_turns - 1, True)),
            )
            for t in group
        )
    )


async def _finish(hook: GroupHook, group: TrajectoryGroup) -> TrajectoryGroup:
    try:
        return _finished_group(group, await hook(group))
    except InfraError as e:
        return _failed_group(group, e)


def env_episodes(
    env: EnvSource, policy: Policy, renderer: ChatRenderer, config: RolloutConfig | None = None
) -> tuple[EpisodeFn, str]:
    """``(episode, env id)``: the :data:`EpisodeFn` of a native env, each episode in a fresh env (closed
    afterwards) run by :func:`~agentrl.episode.run_episode`."""
    factory, env_id = _env_factory(env)
    cfg = config or RolloutConfig()

    async def episode(seed: int, member: int, meta: TrajectoryMeta) -> tuple[Trajectory, ...]:
        e = factory()
        try:
            # one sample, or several when the episode outgrew its context (agentrl.samples)
            return await run_samples(e, policy, renderer, cfg, seed=seed, meta=meta, member=member)
        finally:
            await e.close()

    return episode, env_id


async def _run_group(
    episode: EpisodeFn,
    meta: TrajectoryMeta,
    *,
    group_size: int,
    seed: int,
    limit: asyncio.Semaphore,
    emit: Callable[[EpisodeDone], None],
    finish_group: GroupHook | None = None,
) -> None:
    """The one group runner: every member an episode under ``limit``, ``emit`` told of each trajectory as
    its episode finishes (the last one with the whole group); with ``finish_group``, of every trajectory
    once the group is complete and the hook has seen it."""
    finished: list[Trajectory] = []
    left = group_size

    async def one(member: int) -> None:
        nonlocal left
        async with limit:
            trajs = await episode(seed, member, meta)
        finished.extend(trajs)
        left -= 1
        if finish_group is not None:
            if left == 0:  # the whole group, judged as one, then reported in one go (no await in between)
                group = await _finish(finish_group, TrajectoryGroup(tuple(finished)))
                for i, t in enumerate(group):
                    emit(EpisodeDone(t, group if i == len(group) - 1 else None))
            return
        for i, t in enumerate(trajs):
            last = left == 0 and i == len(trajs) - 1
            emit(EpisodeDone(t, TrajectoryGroup(tuple(finished)) if last else None))

    tasks = [asyncio.ensure_future(one(m)) for m in range(group_size)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        # One member raised (TemplateError in "raise" mode) or we were cancelled: stop the others too.
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def run_group(
    env: EnvSource,
    policy: Policy,
    renderer: ChatRenderer,
    config: RolloutConfig | None = None,
    *,
    group_size: int,
    seed: int,
    meta: TrajectoryMeta | None = None,
) -> TrajectoryGroup:
    """Run ``group_size`` episodes of the same task (every env is reset with ``seed``) concurrently.

    Each member gets a fresh env (built from ``env`` and closed afterwards). The members share
    ``meta.group_id`` (a new id when empty) and ``task_id`` (``"<env id>:<seed>"`` when empty), which link
    them for group-relative credit assignment. Members are in the order they finished. An episode that
    outgrew its context (:mod:`agentrl.samples`) contributes all its samples, in order, linked by
    ``meta.episode_id``; the group is complete when all ``group_size`` episodes are. The same scheduler as
    :func:`run_groups`, for one seed.
    """
    (group,) = [
        done.group
        async for done in run_groups(
            env, policy, renderer, config, seeds=(seed,), group_size=group_size, meta=meta
        )
        if done.group is not None
    ]
    return group


async def run_groups(
    env: EnvSource,
    policy: Policy,
    renderer: ChatRenderer,
    config: RolloutConfig | None = None,
    *,
    seeds: Iterable[int],
    group_size: int,
    meta: TrajectoryMeta | None = None,
    limit: asyncio.Semaphore | None = None,
    finish_group: GroupHook | None = None,
) -> AsyncIterator[EpisodeDone]:
    """Run one group per seed of ``env``, many at once; yield an :class:`EpisodeDone` per finished episode.

    At most ``config.concurrency`` episodes run at a time (or as many as ``limit`` lets through: a trainer
    shares one limit between every group in flight). Groups start lazily (enough to keep ``concurrency``
    episodes busy, plus one waiting in line), so ``seeds`` may be an endless iterator. A ``TemplateError``
    (``on_template_mismatch="raise"``) surfaces at once; closing the iterator early cancels the running
    episodes and closes their envs. The members of a group share ``meta.group_id`` (a new id when empty)
    and ``task_id`` (:func:`task_id` when empty). ``finish_group`` (a :data:`GroupHook`) sees each complete
    group before its members are yielded (they then come together, the group's last carrying it).

    Example::

        async for done in run_groups("math-tir-v0", policy, renderer, cfg, seeds=range(8), group_size=4):
            await store.append(done.trajectory)   # every episode, as it finishes
            if done.group is not None:
                groups.append(done.group)         # every group, as it completes
    """
    _check_group_size(group_size)
    cfg = config or RolloutConfig()
    episode, env_id = env_episodes(env, policy, renderer, cfg)
    events = schedule_groups(
        episode,
        env_id=env_id,
        seeds=seeds,
        group_size=group_size,
        meta=meta,
        concurrency=cfg.concurrency,
        limit=limit,
        finish_group=finish_group,
    )
    async with contextlib.aclosing(events):  # closing this iterator early closes the scheduler now
        async for done in events:
            yield done


async def schedule_groups(
    episode: EpisodeFn,
    *,
    env_id: str,
    seeds: Iterable[int],
    group_size: int,
    meta: TrajectoryMeta | None,
    concurrency: int,
    limit: asyncio.Semaphore | None = None,
    finish_group: GroupHook | None = None,
) -> AsyncGenerator[EpisodeDone, None]:
    """The one scheduler: ``group_size`` runs of ``episode`` per seed, at most ``concurrency`` at a time (or
    what the shared ``limit`` allows), yielding an :class:`EpisodeDone` per trajectory as its episode ends
    (the group's last carries the group). ``episode`` is a native env episode (:func:`env_episodes`), a
    gateway session (``agentrl train --agent``) or a Ray worker's episode on its inference servers. With
    ``finish_group`` (a :data:`GroupHook`: a group-wise judge) a group's trajectories are held until the
    group is complete, passed through the hook, and yielded together."""
    _check_group_size(group_size)
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be a positive int, got {concurrency!r}")
    queue: asyncio.Queue[EpisodeDone | BaseException | None] = asyncio.Queue()
    sem = limit if limit is not None else asyncio.Semaphore(concurrency)
    slots = asyncio.Semaphore(max(1, -(-concurrency // group_size)) + 1)

    async def group(seed: int) -> None:
        try:
            await _run_group(
                episode,
                group_meta(meta, env_id, seed),
                group_size=group_size,
                seed=seed,
                limit=sem,
                emit=queue.put_nowait,
                finish_group=finish_group,
            )
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # surface at once (TemplateError in "raise" mode)
            queue.put_nowait(e)
            raise
        finally:
            slots.release()

    async def drive() -> None:
        tasks: set[asyncio.Future[None]] = set()
        try:
            for s in seeds:
                await slots.acquire()
                task = asyncio.ensure_future(group(s))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            queue.put_nowait(None)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # e.g. the seeds iterator raised
            queue.put_nowait(e)
        finally:
            pending = [t for t in tasks if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    driver = asyncio.ensure_future(drive())
    try:
        while True:
            item = await queue.get()
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        if not driver.done():
            driver.cancel()
            await asyncio.gather(driver, return_exceptions=True)


async def collect(
    env: EnvSource,
    policy: Policy,
    renderer: ChatRenderer,
    *,
    n_groups: int,
    group_size: int,
    store: TrajectoryStore | None = None,
    config: RolloutConfig | None = None,
    seed: int = 0,
    meta: TrajectoryMeta | None = None,
) -> list[TrajectoryGroup]:
    """Run ``n_groups`` groups (seeds ``seed, seed+1, ...``) of ``group_size`` episodes each, append every
    trajectory to ``store`` as it finishes, and return the groups in the order they completed.

    Example::

        import asyncio

        from agentrl import JsonlStore
        from agentrl.chat import ChatRenderer
        from agentrl.models import load_model, load_tokenizer, smollm2_dir
        from agentrl.policies import HFPolicy
        from agentrl.rollout import RolloutConfig, collect

        path = smollm2_dir()
        tok = load_tokenizer(path)
        renderer = ChatRenderer(tok)
        policy = HFPolicy(load_model(path), tok, stop_token_ids=renderer.stop_token_ids)
        cfg = RolloutConfig(max_new_tokens=64, audit=True)
        groups = asyncio.run(collect("exact-answer-v0", policy, renderer, n_groups=2, group_size=4,
                                     store=JsonlStore("rollouts.jsonl"), config=cfg))
    """
    if not isinstance(n_groups, int) or n_groups < 0:
        raise ConfigError(f"n_groups must be a non-negative int, got {n_groups!r}")
    out: list[TrajectoryGroup] = []
    async for done in run_groups(
        env, policy, renderer, config, seeds=range(seed, seed + n_groups), group_size=group_size, meta=meta
    ):
        if store is not None:
            await store.append(done.trajectory)
        if done.group is not None:
            out.append(done.group)
    return out
