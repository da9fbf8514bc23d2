"""Groups of episodes, many at once: the one scheduler.

* :func:`run_group` runs ``group_size`` episodes of one task (every env reset with the same seed)
  concurrently and returns them as a :class:`~agentrl.groups.TrajectoryGroup`.
* :func:`run_groups` runs one group per seed with at most ``concurrency`` episodes in flight and yields an
  :class:`EpisodeDone` for every episode the moment it finishes (so a caller can store it at once: a crash
  loses nothing); the event of the episode that completes its group also carries the whole group (so a
  trainer can assign credit group by group). One stream, one code path, both granularities.
* :func:`collect` drives :func:`run_groups` into a store and returns the groups.

One episode is :func:`agentrl.episode.run_episode`; its settings are :class:`~agentrl.episode.RolloutConfig`
(both re-exported here).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

from agentrl.chat import ChatRenderer
from agentrl.env import Env
from agentrl.episode import RolloutConfig, run_episode
from agentrl.errors import ConfigError
from agentrl.groups import TrajectoryGroup
from agentrl.protocols import Policy, TrajectoryStore
from agentrl.samples import run_samples
from agentrl.types import Trajectory, TrajectoryMeta

__all__ = [
    "EnvSource",
    "EpisodeDone",
    "RolloutConfig",
    "collect",
    "run_episode",
    "run_group",
    "run_groups",
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


async def _run_group(
    factory: Callable[[], Env],
    env_id: str,
    policy: Policy,
    renderer: ChatRenderer,
    cfg: RolloutConfig,
    *,
    group_size: int,
    seed: int,
    meta: TrajectoryMeta | None,
    limit: asyncio.Semaphore,
    emit: Callable[[EpisodeDone], None],
) -> None:
    """The one group runner: every member in its own env, ``emit`` told of each as it finishes (the last
    one with the whole group)."""
    base = meta or TrajectoryMeta()
    base = dataclasses.replace(
        base,
        env_id=base.env_id or env_id,
        task_id=base.task_id or f"{base.env_id or env_id or 'env'}:{seed}",
        group_id=base.group_id or uuid.uuid4().hex,
    )
    finished: list[Trajectory] = []
    episodes = 0

    async def one(member: int) -> None:
        nonlocal episodes
        async with limit:
            e = factory()
            try:  # one sample, or several when the episode outgrew its context (agentrl.samples)
                samples = await run_samples(e, policy, renderer, cfg, seed=seed, meta=base, member=member)
            finally:
                await e.close()
        episodes += 1
        for k, traj in enumerate(samples):
            finished.append(traj)
            last = episodes == group_size and k == len(samples) - 1
            emit(EpisodeDone(traj, TrajectoryGroup(tuple(finished)) if last else None))

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
) -> AsyncIterator[EpisodeDone]:
    """Run one group per seed, many at once; yield an :class:`EpisodeDone` as each episode finishes.

    At most ``config.concurrency`` episodes run at a time. Groups start lazily (enough to keep
    ``concurrency`` episodes busy, plus one waiting in line), so ``seeds`` may be an endless iterator.
    A ``TemplateError`` (``on_template_mismatch="raise"``) surfaces at once; closing the iterator early
    cancels the running episodes and closes their envs.

    Example::

        async for done in run_groups("math-tir-v0", policy, renderer, cfg, seeds=range(8), group_size=4):
            await store.append(done.trajectory)   # every episode, as it finishes
            if done.group is not None:
                groups.append(done.group)         # every group, as it completes
    """
    _check_group_size(group_size)
    cfg = config or RolloutConfig()
    factory, env_id = _env_factory(env)
    queue: asyncio.Queue[EpisodeDone | BaseException | None] = asyncio.Queue()
    limit = asyncio.Semaphore(cfg.concurrency)
    slots = asyncio.Semaphore(max(1, -(-cfg.concurrency // group_size)) + 1)

    async def group(seed: int) -> None:
        try:
            await _run_group(
                factory,
                env_id,
                policy,
                renderer,
                cfg,
                group_size=group_size,
                seed=seed,
                meta=meta,
                limit=limit,
                emit=queue.put_nowait,
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
