"""The rollout engine: token-in/token-out multi-turn episodes, groups of them, many groups at once.

One episode (:func:`run_episode`)::

    reset -> render prompt -> [generate -> step -> render delta]* -> Trajectory

* The policy sees token ids and returns token ids with the sampler's log-probs. Sampled ids go into the
  trajectory as sampled; the environment gets their decoded text (stop token removed) as the
  :class:`~agentrl.types.Action`.
* The environment parses tool calls itself; the rollout records the parsed message it reports in
  ``info[INFO_ASSISTANT_MESSAGE]`` (or ``Message("assistant", text)``) and its ``info[INFO_TOOL_RECORDS]``.
  The rollout has no parser of its own, so evaluation and training cannot drift apart (pitfall §15.7).
* Observation tokens come from :meth:`agentrl.chat.ChatRenderer.render_delta`, which checks that the
  template is append-only for this conversation. On a mismatch the episode raises or stops, as
  :attr:`RolloutConfig.on_template_mismatch` says; it never continues with a corrupted stream.
* All token columns are built by :func:`agentrl.masking.build_columns`.

Limits. ``max_turns`` (``StopReason.MAX_TURNS``), ``sampling.max_new_tokens`` per turn and
``max_total_tokens`` for the whole token stream (prompt + turns + observations). All set ``truncated``.

**A generation that ends by length** (no stop token) ends the episode: ``truncated=True`` with
``StopReason.TURN_TOKENS`` (or ``MAX_TOKENS`` when the total budget was what cut it), and the environment
does not see the half-finished turn. The cut tokens stay in the trajectory exactly as sampled (mask 1, with
their log-probs); the stop reason lets the trainer decide what to do with them (keep, mask out, penalize).

Failures. An exception from the environment (``ENV_ERROR``), the policy (``POLICY_ERROR``) or a tool call
whose status is ``sandbox_error`` (``SANDBOX_ERROR``) stops the episode; the trajectory is still returned
with the error recorded and ``infra_failure`` set, so the trainer drops it instead of scoring it 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.chat import ChatRenderer
from agentrl.env import INFO_ASSISTANT_MESSAGE, INFO_TOOL_RECORDS, Env
from agentrl.errors import (
    ConfigError,
    EnvContractError,
    PolicyError,
    SandboxError,
    TemplateError,
)
from agentrl.masking import Piece, build_columns
from agentrl.protocols import FinishReason, Generation, Policy, Sampling, TrajectoryStore
from agentrl.types import (
    Action,
    EpisodeFailure,
    Message,
    StopReason,
    ToolRecord,
    Trajectory,
    TrajectoryMeta,
)

__all__ = [
    "EnvSource",
    "RolloutConfig",
    "collect",
    "iter_groups",
    "run_episode",
    "run_group",
    "run_groups",
    "summarize",
]

EnvSource = str | Callable[[], Env]
"""A registered env id (built with :func:`agentrl.make`) or a zero-argument factory returning an Env."""


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    """How episodes are run. Validated on construction."""

    max_turns: int = 8
    """Most model turns per episode; hitting it sets ``truncated`` (``StopReason.MAX_TURNS``)."""
    sampling: Sampling = field(default_factory=Sampling)
    """Sampling settings; ``sampling.max_new_tokens`` is the per-turn token limit. A ``sampling.seed``
    is a base seed: each (group seed, member, turn) gets its own seed derived from it."""
    max_total_tokens: int = 4096
    """Most tokens in the whole stream (prompt, turns, observations); the context budget."""
    concurrency: int = 32
    """Most episodes in flight at once across all groups (``run_groups``/``iter_groups``/``collect``)."""
    on_template_mismatch: Literal["raise", "stop"] = "raise"
    """When the chat template is not append-only for a conversation: ``"raise"`` a TemplateError to the
    caller (fail loudly; the default), or ``"stop"`` the episode (``truncated``,
    ``StopReason.TEMPLATE_MISMATCH``, the error recorded) and carry on with the others."""
    audit: bool = False
    """Run :func:`agentrl.audit.audit_trajectory` on every trajectory (raises AuditError). For tests and
    debugging; costs a few decodes per turn."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_total_tokens", "concurrency"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"RolloutConfig.{name} must be a positive int, got {v!r}")
        if not isinstance(self.sampling, Sampling):
            raise ConfigError(
                f"RolloutConfig.sampling must be a Sampling, got {type(self.sampling).__name__}"
            )
        if self.on_template_mismatch not in ("raise", "stop"):
            raise ConfigError(
                f"on_template_mismatch must be 'raise' or 'stop', got {self.on_template_mismatch!r}"
            )
        if not isinstance(self.audit, bool):
            raise ConfigError(f"RolloutConfig.audit must be a bool, got {self.audit!r}")


# -------------------------------------------------------------------------------------------------
def _derive_seed(base: int | None, group_seed: int | None, member: int, turn: int) -> int | None:
    if base is None:
        return None
    g = 0 if group_seed is None else group_seed
    return (base * 1_000_003 + g * 8_191 + member * 131 + turn) % (2**31 - 1)


def _check_generation(gen: Any, vocab_size: int, max_new: int) -> Generation:
    """Reject what a policy must never return (engine-side wrong ids, pitfall §15.5)."""
    if not isinstance(gen, Generation):
        raise PolicyError(f"policy returned {type(gen).__name__}, not a Generation")
    if not gen.token_ids:
        raise PolicyError("policy returned an empty generation")
    if len(gen.token_ids) > max_new:
        raise PolicyError(f"policy returned {len(gen.token_ids)} tokens, more than max_new_tokens={max_new}")
    for t in gen.token_ids:
        if not isinstance(t, int) or not 0 <= t < vocab_size:
            raise PolicyError(f"policy returned token id {t!r}, outside the vocabulary [0, {vocab_size})")
    for lp in gen.logprobs:
        if not (isinstance(lp, (int, float)) and math.isfinite(lp) and lp <= 1e-6):
            raise PolicyError(f"policy returned log-prob {lp!r}; log-probs must be finite and <= 0")
    return gen


def _check_step(out: Any) -> tuple[tuple[Message, ...], float, bool, bool, dict[str, Any]]:
    if not (isinstance(out, tuple) and len(out) == 5):
        raise EnvContractError(
            f"step must return (obs, reward, terminated, truncated, info), got {out!r:.200}"
        )
    obs, reward, terminated, truncated, info = out
    obs = tuple(obs)
    if not all(isinstance(m, Message) for m in obs):
        raise EnvContractError("step's observation must be a tuple of Message")
    if not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise EnvContractError(f"step's reward must be a finite number, got {reward!r}")
    if not isinstance(info, dict):
        raise EnvContractError(f"step's info must be a dict, got {type(info).__name__}")
    return obs, float(reward), bool(terminated), bool(truncated), info


async def run_episode(
    env: Env,
    policy: Policy,
    renderer: ChatRenderer,
    config: RolloutConfig | None = None,
    *,
    seed: int | None = None,
    meta: TrajectoryMeta | None = None,
    options: dict[str, Any] | None = None,
    member: int = 0,
) -> Trajectory:
    """Run one episode of ``env`` with ``policy`` and return its trajectory (never raises for env,
    policy or sandbox failures; those are recorded).

    Args:
        env: The environment (not closed here; the caller owns it).
        policy: Token-in/token-out policy; it must stop on ``renderer.stop_token_ids``.
        renderer: Chat template renderer for the policy's tokenizer.
        config: Limits and behaviour (default :class:`RolloutConfig`).
        seed: Passed to ``env.reset``.
        meta: Identity fields (group id, task id, step...); env id, seed, policy version and episode id
            are filled in when empty.
        options: Passed to ``env.reset``.
        member: Index within the group (only used to derive per-turn sampling seeds).

    Raises:
        TemplateError: the template is not append-only and ``config.on_template_mismatch == "raise"``.
        AuditError: ``config.audit`` is on and the trajectory breaks an invariant (a bug).
    """
    cfg = config or RolloutConfig()
    ep = _Episode(start_version=int(getattr(policy, "version", 0)))
    timings, pieces, messages, rewards = ep.timings, ep.pieces, ep.messages, ep.rewards
    fail = ep.fail

    def finish() -> Trajectory:
        return ep.finish(meta or TrajectoryMeta(), env, seed, cfg, renderer)

    tools = list(getattr(env, "tools", ()) or ())
    history: list[Message] = []  # what the template renders: assistant turns carry their sampled text
    ids: list[int] = []
    prefix_text = ""
    t0 = time.perf_counter()
    try:
        obs, _info = await env.reset(seed=seed, options=options)
        obs = tuple(obs)
        if not obs or not all(isinstance(m, Message) for m in obs):
            raise EnvContractError("reset must return a non-empty tuple of Message as the observation")
    except Exception as e:
        timings["reset"] = time.perf_counter() - t0
        fail(type(e).__name__, str(e), -1, _infra_reason(e))
        return finish()
    timings["reset"] = time.perf_counter() - t0
    messages.extend(obs)
    history.extend(obs)

    t0 = time.perf_counter()
    try:
        prompt = renderer.render_prompt(obs, tools=tools)
    except TemplateError as e:
        timings["render"] += time.perf_counter() - t0
        if cfg.on_template_mismatch == "raise":
            raise
        ep.truncated = True
        fail("TemplateError", str(e), -1, StopReason.TEMPLATE_MISMATCH, infra=False)
        return finish()
    timings["render"] += time.perf_counter() - t0
    pieces.extend(prompt.pieces)
    ids.extend(prompt.token_ids)
    prefix_text = prompt.text

    turn = 0
    while True:
        budget = cfg.max_total_tokens - len(ids)
        if budget <= 0:
            ep.truncated, ep.stop_reason = True, StopReason.MAX_TOKENS
            break
        max_new = min(cfg.sampling.max_new_tokens, budget)
        sampling = dataclasses.replace(
            cfg.sampling,
            max_new_tokens=max_new,
            seed=_derive_seed(cfg.sampling.seed, seed, member, turn),
        )
        t0 = time.perf_counter()
        try:
            gen = _check_generation(await policy.generate(tuple(ids), sampling), renderer.vocab_size, max_new)
            if gen.finish_reason is FinishReason.STOP and not renderer.is_stop(gen.token_ids[-1]):
                last = gen.token_ids[-1]
                raise PolicyError(
                    f"the policy stopped on token {last} ({renderer.decode([last])!r}), which the "
                    f"renderer does not treat as a stop token {renderer.stop_token_ids}; give both "
                    "the same stop_token_ids"
                )
        except Exception as e:
            timings["generate"] += time.perf_counter() - t0
            fail(type(e).__name__, str(e), turn, StopReason.POLICY_ERROR)
            break
        timings["generate"] += time.perf_counter() - t0
        ep.versions.append(gen.policy_version)
        sampled = gen.token_ids
        text = renderer.assistant_text(sampled)
        asst_index = len(messages)
        pieces.append(Piece.sampled(sampled, gen.logprobs, turn, asst_index))
        ids.extend(sampled)

        if gen.finish_reason is FinishReason.LENGTH or not renderer.is_stop(sampled[-1]):
            messages.append(Message("assistant", text))
            ep.truncated = True
            ep.stop_reason = (
                StopReason.MAX_TOKENS if max_new < cfg.sampling.max_new_tokens else StopReason.TURN_TOKENS
            )
            break

        t0 = time.perf_counter()
        ep.actions.append(text)
        try:
            step_out = _check_step(await env.step(Action(text=text, token_ids=tuple(sampled))))
        except Exception as e:
            timings["env"] += time.perf_counter() - t0
            messages.append(Message("assistant", text))
            fail(type(e).__name__, str(e), turn, _infra_reason(e))
            break
        timings["env"] += time.perf_counter() - t0
        new_obs, reward, term, trunc, info = step_out
        parsed = info.get(INFO_ASSISTANT_MESSAGE)
        messages.append(
            parsed
            if isinstance(parsed, Message) and parsed.role == "assistant"
            else Message("assistant", text)
        )
        rewards.append(reward)
        records = tuple(r for r in (info.get(INFO_TOOL_RECORDS) or ()) if isinstance(r, ToolRecord))
        ep.tool_records.extend(records)
        first_obs_index = len(messages)
        messages.extend(new_obs)
        infra_records = [r for r in records if r.status.is_infra]
        if infra_records:
            r0 = infra_records[0]
            fail("SandboxError", r0.detail or r0.output or "sandbox error", turn, StopReason.SANDBOX_ERROR)
            break
        if term:
            ep.terminated, ep.stop_reason = True, StopReason.TERMINATED
            break
        if trunc:
            ep.truncated, ep.stop_reason = True, StopReason.ENV_TRUNCATED
            break
        if turn + 1 >= cfg.max_turns:
            ep.truncated, ep.stop_reason = True, StopReason.MAX_TURNS
            break

        t0 = time.perf_counter()
        try:
            delta = renderer.render_delta(
                history,
                ids[: len(ids) - len(sampled)],
                prefix_text,
                sampled,
                new_obs,
                turn=turn,
                first_message_index=first_obs_index,
                tools=tools,
            )
        except TemplateError as e:
            timings["render"] += time.perf_counter() - t0
            if cfg.on_template_mismatch == "raise":
                raise
            ep.truncated = True
            fail("TemplateError", str(e), turn, StopReason.TEMPLATE_MISMATCH, infra=False)
            break
        timings["render"] += time.perf_counter() - t0
        if len(ids) + len(delta.token_ids) >= cfg.max_total_tokens:
            # No room left for even one sampled token after this observation.
            ep.truncated, ep.stop_reason = True, StopReason.MAX_TOKENS
            break
        history.append(Message("assistant", delta.assistant_text))
        history.extend(new_obs)
        pieces.extend(delta.pieces)
        ids.extend(delta.token_ids)
        prefix_text = delta.text
        turn += 1

    return finish()


def _infra_reason(e: BaseException) -> StopReason:
    return StopReason.SANDBOX_ERROR if isinstance(e, SandboxError) else StopReason.ENV_ERROR


@dataclass
class _Episode:
    """What one episode has accumulated so far (internal and mutable; the result is a frozen Trajectory)."""

    start_version: int
    pieces: list[Piece] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    tool_records: list[ToolRecord] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    errors: list[EpisodeFailure] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    stop_reason: StopReason = StopReason.TERMINATED
    timings: dict[str, float] = field(
        default_factory=lambda: {"reset": 0.0, "generate": 0.0, "env": 0.0, "render": 0.0}
    )
    t_start: float = field(default_factory=time.perf_counter)

    def fail(self, kind: str, message: str, turn: int, reason: StopReason, infra: bool = True) -> None:
        self.errors.append(EpisodeFailure(kind, message, turn, infra))
        self.stop_reason = reason

    def finish(
        self, meta: TrajectoryMeta, env: Env, seed: int | None, cfg: RolloutConfig, renderer: ChatRenderer
    ) -> Trajectory:
        cols = build_columns(self.pieces)
        extra = dict(meta.extra)
        if self.versions and max(self.versions) != min(self.versions):
            extra["policy_version_max"] = max(self.versions)
        meta = dataclasses.replace(
            meta,
            env_id=meta.env_id or (env.spec_id or type(env).__name__),
            seed=meta.seed if meta.seed is not None else seed,
            policy_version=min(self.versions) if self.versions else self.start_version,
            episode_id=meta.episode_id or uuid.uuid4().hex,
            extra=extra,
        )
        self.timings["total"] = time.perf_counter() - self.t_start
        traj = Trajectory(
            token_ids=cols.token_ids,
            loss_mask=cols.loss_mask,
            logprobs=cols.logprobs,
            segments=cols.segments,
            messages=tuple(self.messages),
            tool_calls=tuple(self.tool_records),
            actions=tuple(self.actions),
            rewards=tuple(self.rewards),
            terminated=self.terminated,
            truncated=self.truncated,
            stop_reason=self.stop_reason,
            errors=tuple(self.errors),
            meta=meta,
            timings=self.timings,
        )
        if cfg.audit:
            from agentrl.audit import audit_trajectory

            audit_trajectory(traj, renderer)
        return traj


# -------------------------------------------------------------------------------------------------
def _env_factory(env: EnvSource) -> tuple[Callable[[], Env], str]:
    if isinstance(env, str):
        from agentrl.registry import make, spec

        spec(env)  # fail early with EnvNotFoundError
        return (lambda: make(env)), env
    if callable(env):
        return env, ""
    raise ConfigError(f"env must be a registered id or a factory returning an Env, got {env!r}")


async def run_group(
    env: EnvSource,
    policy: Policy,
    renderer: ChatRenderer,
    config: RolloutConfig | None = None,
    *,
    group_size: int,
    seed: int,
    meta: TrajectoryMeta | None = None,
    _limit: asyncio.Semaphore | None = None,
    _on_done: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Run ``group_size`` episodes of the same task (every env is reset with ``seed``) concurrently.

    Each member gets a fresh env (built from ``env`` and closed afterwards). The members share
    ``meta.group_id`` (a new id when empty) and ``task_id`` (``"<env id>:<seed>"`` when empty), which link
    them for group-relative credit assignment. Returned in member order.
    """
    if not isinstance(group_size, int) or group_size < 1:
        raise ConfigError(f"group_size must be a positive int, got {group_size!r}")
    cfg = config or RolloutConfig()
    factory, env_id = _env_factory(env)
    base = meta or TrajectoryMeta()
    base = dataclasses.replace(
        base,
        env_id=base.env_id or env_id,
        task_id=base.task_id or f"{base.env_id or env_id or 'env'}:{seed}",
        group_id=base.group_id or uuid.uuid4().hex,
    )
    limit = _limit or asyncio.Semaphore(cfg.concurrency)

    async def one(member: int) -> Trajectory:
        async with limit:
            e = factory()
            try:
                traj = await run_episode(e, policy, renderer, cfg, seed=seed, meta=base, member=member)
            finally:
                await e.close()
        if _on_done is not None:
            _on_done(traj)
        return traj

    tasks = [asyncio.ensure_future(one(m)) for m in range(group_size)]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # One member raised (TemplateError in "raise" mode) or we were cancelled: stop the others too.
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _groups_in_flight(cfg: RolloutConfig, group_size: int) -> int:
    """Groups started at once: enough to keep ``concurrency`` episodes busy, plus one waiting in line."""
    return max(1, -(-cfg.concurrency // group_size)) + 1


async def iter_groups(
    env: EnvSource,
    policy: Policy,
    renderer: ChatRenderer,
    config: RolloutConfig | None = None,
    *,
    seeds: Iterable[int],
    group_size: int,
    meta: TrajectoryMeta | None = None,
) -> AsyncIterator[list[Trajectory]]:
    """Run one group per seed, many at once, yielding each group as soon as all its members finish.

    At most ``config.concurrency`` episodes run at a time; groups are started lazily, so ``seeds`` may be
    an endless iterator.
    """
    cfg = config or RolloutConfig()
    limit = asyncio.Semaphore(cfg.concurrency)
    max_groups = _groups_in_flight(cfg, group_size)
    seed_iter = iter(seeds)
    pending: set[asyncio.Task[list[Trajectory]]] = set()

    def start_more() -> None:
        while len(pending) < max_groups:
            try:
                s = next(seed_iter)
            except StopIteration:
                return
            pending.add(
                asyncio.ensure_future(
                    run_group(
                        env, policy, renderer, cfg, group_size=group_size, seed=s, meta=meta, _limit=limit
                    )
                )
            )

    try:
        start_more()
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                pending.discard(task)
            start_more()
            for task in done:
                yield task.result()
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


async def run_groups(
    env: EnvSource,
    policy: Policy,
    renderer: ChatRenderer,
    config: RolloutConfig | None = None,
    *,
    seeds: Iterable[int],
    group_size: int,
    meta: TrajectoryMeta | None = None,
) -> AsyncIterator[Trajectory]:
    """Like :func:`iter_groups`, but yields each trajectory as soon as its episode finishes."""
    queue: asyncio.Queue[Trajectory | BaseException | None] = asyncio.Queue()
    cfg = config or RolloutConfig()

    async def drive() -> None:
        tasks: set[asyncio.Future[None]] = set()
        limit = asyncio.Semaphore(cfg.concurrency)
        sem = asyncio.Semaphore(_groups_in_flight(cfg, group_size))

        async def group(s: int) -> None:
            try:
                await run_group(
                    env,
                    policy,
                    renderer,
                    cfg,
                    group_size=group_size,
                    seed=s,
                    meta=meta,
                    _limit=limit,
                    _on_done=queue.put_nowait,
                )
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # surface at once (TemplateError in "raise" mode, bad env id)
                queue.put_nowait(e)
                raise
            finally:
                sem.release()

        try:
            for s in seeds:
                await sem.acquire()
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
) -> list[Trajectory]:
    """Run ``n_groups`` groups (seeds ``seed, seed+1, ...``) of ``group_size`` episodes each, append every
    trajectory to ``store`` as it finishes, and return them all (in completion order).

    Example::

        import asyncio

        from agentrl import JsonlStore, Sampling
        from agentrl.chat import ChatRenderer
        from agentrl.models import load_model, load_tokenizer, smollm2_dir
        from agentrl.policies import HFPolicy
        from agentrl.rollout import RolloutConfig, collect

        path = smollm2_dir()
        tok = load_tokenizer(path)
        renderer = ChatRenderer(tok)
        policy = HFPolicy(load_model(path), tok, stop_token_ids=renderer.stop_token_ids)
        cfg = RolloutConfig(sampling=Sampling(max_new_tokens=64), audit=True)
        trajs = asyncio.run(collect("exact-answer-v0", policy, renderer, n_groups=2, group_size=4,
                                    store=JsonlStore("rollouts.jsonl"), config=cfg))
    """
    if not isinstance(n_groups, int) or n_groups < 0:
        raise ConfigError(f"n_groups must be a non-negative int, got {n_groups!r}")
    out: list[Trajectory] = []
    async for traj in run_groups(
        env, policy, renderer, config, seeds=range(seed, seed + n_groups), group_size=group_size, meta=meta
    ):
        if store is not None:
            await store.append(traj)
        out.append(traj)
    return out


def summarize(trajs: Sequence[Trajectory]) -> Mapping[str, float]:
    """Small summary for logs: episodes, mean reward (non-infra), infra failures, mean model tokens."""
    ok = [t for t in trajs if not t.infra_failure]
    return {
        "episodes": float(len(trajs)),
        "infra_failures": float(len(trajs) - len(ok)),
        "mean_reward": (sum(t.reward for t in ok) / len(ok)) if ok else float("nan"),
        "mean_model_tokens": (sum(t.num_model_tokens for t in ok) / len(ok)) if ok else float("nan"),
        "truncated": float(sum(t.truncated for t in trajs)),
    }
