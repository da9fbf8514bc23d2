"""One episode, token in / token out: :func:`run_episode` and the settings every rollout obeys.

::

    reset -> render prompt -> [generate -> step -> render delta]* -> Trajectory

* The policy sees token ids and returns token ids with the sampler's log-probs. Sampled ids go into the
  trajectory as sampled; the environment gets their decoded text (stop token removed) as the
  :class:`~agentrl.types.Action`.
* The environment parses tool calls itself; the rollout records the parsed message its
  :class:`~agentrl.env.StepResult` reports (``assistant_message``, else ``Message("assistant", text)``) and
  its ``tool_calls``. The rollout has no parser of its own, so evaluation and training cannot drift apart
  (pitfall §15.7).
* Observation tokens come from :meth:`agentrl.chat.ChatRenderer.render_delta`, which checks that the
  template is append-only for this conversation. On a mismatch the episode raises or stops, as
  :attr:`RolloutConfig.on_template_mismatch` says; it never continues with a corrupted stream.
* The trajectory is built by :func:`agentrl.masking.build_trajectory` (its columns by ``build_columns``).

Limits, each with one owner and one stop reason. The rollout owns the compute budget: ``max_turns``
(``MAX_TURNS``), ``max_new_tokens`` per turn (``TURN_TOKENS``), ``max_total_tokens`` for the whole token
stream (``MAX_TOKENS``) and ``episode_timeout``, the wall-clock deadline of the whole episode (``DEADLINE``):
past it the generation or env step in progress is cancelled and the episode ends there. The environment
owns the task: it ends an episode with ``terminated`` (``TERMINATED``) or, by a rule of its own such as
guess-number's guess budget, ``truncated`` (``ENV_TRUNCATED``). Every limit sets ``truncated``.

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
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from agentrl.chat import ChatRenderer
from agentrl.env import Env, as_step_result
from agentrl.errors import (
    ConfigError,
    EnvContractError,
    JudgeError,
    PolicyError,
    SandboxError,
    TemplateError,
    removed_arguments,
)
from agentrl.masking import Piece, build_trajectory
from agentrl.protocols import FinishReason, Generation, Policy, Sampling
from agentrl.reward_records import RewardTerm
from agentrl.types import Action, EpisodeFailure, Message, StopReason, ToolRecord, Trajectory, TrajectoryMeta

__all__ = ["RolloutConfig", "SampleSink", "infra_stop_reason", "run_episode"]


@removed_arguments(
    {
        "sampling": "its fields are RolloutConfig's own now: pass temperature=, top_p=, max_new_tokens=, "
        "seed= to RolloutConfig (--rollout.temperature, ...)",
        "tool_format": "the tool-call format is the env's own argument: agentrl.make(env_id, "
        "tool_format=...), TrainConfig(env_kwargs={'tool_format': ...}); --rollout.tool-format still sets it",
    }
)
@dataclass(frozen=True, slots=True)
class RolloutConfig:
    """How episodes are run: the one owner of the rollout's limits and sampling. Validated on construction.

    ``agentrl train`` embeds it as ``--rollout.*`` (with its own defaults for a CPU run).
    """

    max_turns: int = 8
    """Most model turns per episode; reaching it ends the episode as truncated (stop reason max_turns)."""
    max_new_tokens: int = 512
    """Most tokens the model may sample in one turn; a turn cut by it ends the episode (turn_tokens)."""
    max_total_tokens: int = 4096
    """Context budget of a whole episode: prompt, turns and observations (stop reason max_tokens)."""
    episode_timeout: float | None = 1800.0
    """Wall-clock deadline of a whole episode in seconds, generation included (None: none). Past it the
    generation or env step in progress (a tool call, a grade) is cancelled and the episode ends truncated
    (stop reason deadline); a reset that overruns it is an infrastructure failure. Every step's own deadline
    (a ToolEnv's ``tool_timeout``, ``sandbox_start_timeout``, ``grade_timeout``) is shorter."""
    temperature: float = 1.0
    """Sampling temperature; the recorded log-probs are those of the tempered distribution."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off). Below 1 the recorded log-probs are those of the truncated
    distribution, not what a learner recomputes; keep 1 for on-policy training."""
    seed: int | None = None
    """Base seed for sampling: each (group seed, member, turn) gets its own seed derived from it; none
    leaves seeding to the policy."""
    concurrency: int = 32
    """Most episodes in flight at once, across all groups."""
    on_template_mismatch: Literal["raise", "stop"] = "raise"
    """When the chat template is not append-only for a conversation: raise a TemplateError to the caller,
    or stop the episode (truncated, stop reason template_mismatch, the error recorded) and carry on."""
    audit: bool = False
    """Run the token audit (agentrl.audit) on every trajectory; raises AuditError. For tests and debugging;
    costs a few decodes per turn."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_total_tokens", "concurrency"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"RolloutConfig.{name} must be a positive int, got {v!r}")
        t = self.episode_timeout
        if t is not None and (isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < math.inf):
            raise ConfigError(
                f"RolloutConfig.episode_timeout must be a positive number of seconds or None, got {t!r}"
            )
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ConfigError(f"RolloutConfig.seed must be an int or None, got {self.seed!r}")
        if self.on_template_mismatch not in ("raise", "stop"):
            raise ConfigError(
                f"on_template_mismatch must be 'raise' or 'stop', got {self.on_template_mismatch!r}"
            )
        if not isinstance(self.audit, bool):
            raise ConfigError(f"RolloutConfig.audit must be a bool, got {self.audit!r}")
        self.sampling  # noqa: B018 - Sampling validates temperature and top_p

    @property
    def sampling(self) -> Sampling:
        """The per-turn :class:`~agentrl.protocols.Sampling` (before the budget and seed of each turn)."""
        return Sampling(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed
        )

    def turn_sampling(self, max_new: int, group_seed: int | None, member: int, turn: int) -> Sampling:
        """Sampling for one turn: at most ``max_new`` tokens, with the seed derived for this turn."""
        seed = None
        if self.seed is not None:
            g = 0 if group_seed is None else group_seed
            seed = (self.seed * 1_000_003 + g * 8_191 + member * 131 + turn) % (2**31 - 1)
        return Sampling(max_new_tokens=max_new, temperature=self.temperature, top_p=self.top_p, seed=seed)


class SampleSink:
    """Collects an episode's samples in the order they were started (internal to the rollout; mutable).

    ``begin()`` reserves a slot when a sample's context is opened; ``end(slot, trajectory)`` fills it when
    the sample finishes. A sub-agent's samples begin while the parent's current sample is open, so they
    come after it.
    """

    def __init__(self, parent: SampleSink | None = None) -> None:
        self._slots: list[Trajectory | None] = []
        self._parent = parent
        self._in_parent: list[int] = []
        self.subagents = 0
        """Sub-agents started so far (to derive their sampling seeds)."""

    def begin(self) -> int:
        """Reserve the next slot; returns its index. A sub-agent's sink reserves it in its parent's too,
        so the episode's order is the order of ``begin`` across the whole tree."""
        self._slots.append(None)
        if self._parent is not None:
            self._in_parent.append(self._parent.begin())
        return len(self._slots) - 1

    def end(self, slot: int, trajectory: Trajectory) -> None:
        """Fill ``slot`` with the finished sample."""
        if self._slots[slot] is not None:
            raise AssertionError(f"sample slot {slot} was filled twice")  # a rollout bug, not user input
        self._slots[slot] = trajectory
        if self._parent is not None:
            self._parent.end(self._in_parent[slot], trajectory)

    def samples(self) -> tuple[Trajectory, ...]:
        """The finished samples in order (an unfinished slot is a rollout bug)."""
        out = tuple(t for t in self._slots if t is not None)
        if len(out) != len(self._slots):
            raise AssertionError("an episode ended with a sample that never finished")
        return out


# -------------------------------------------------------------------------------------------------
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
    samples: SampleSink | None = None,
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
        samples: Collects every sample of an episode that outgrows one context (an env's ``compact``;
            :func:`agentrl.samples.run_samples` passes one). Without it, an env that compacts ends the
            episode as ``env_error``. The return value is then the episode's last sample.

    Raises:
        TemplateError: the template is not append-only and ``config.on_template_mismatch == "raise"``.
        AuditError: ``config.audit`` is on and the trajectory breaks an invariant (a bug).
    """
    cfg = config or RolloutConfig()
    ep = _Episode(start_version=int(getattr(policy, "version", 0)))
    timings, pieces, messages, rewards = ep.timings, ep.pieces, ep.messages, ep.rewards
    fail = ep.fail
    slot = samples.begin() if samples is not None else -1
    done_turns = 0  # model turns of the episode's earlier samples (turn limit and sampling seeds)

    def finish() -> Trajectory:
        traj = ep.finish(meta or TrajectoryMeta(), env, seed, cfg, renderer)
        if samples is not None:
            samples.end(slot, traj)
        return traj

    tools = list(getattr(env, "tools", ()) or ())
    history: list[Message] = []  # what the template renders: assistant turns carry their sampled text
    ids: list[int] = []
    prefix_text = ""
    loop = asyncio.get_running_loop()
    deadline = None if cfg.episode_timeout is None else loop.time() + cfg.episode_timeout
    t0 = time.perf_counter()
    try:
        obs, _info = await _by(deadline, env.reset(seed=seed, options=options))
        obs = tuple(obs)
        if not obs or not all(isinstance(m, Message) for m in obs):
            raise EnvContractError("reset must return a non-empty tuple of Message as the observation")
    except _DeadlinePassed:  # no prompt, nothing to train on: the env (or its sandbox) was too slow
        timings["reset"] = time.perf_counter() - t0
        fail("EpisodeDeadline", f"{_deadline_text(cfg)} during reset", -1, StopReason.DEADLINE)
        return finish()
    except Exception as e:
        timings["reset"] = time.perf_counter() - t0
        fail(type(e).__name__, str(e), -1, infra_stop_reason(e))
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

    def out_of_time(during: str) -> None:
        ep.truncated, ep.stop_reason = True, StopReason.DEADLINE
        ep.errors.append(EpisodeFailure("EpisodeDeadline", f"{_deadline_text(cfg)} {during}", turn, False))

    turn = 0
    while True:
        if deadline is not None and loop.time() >= deadline:  # steps that never suspend are caught here
            out_of_time(f"before turn {turn}")
            break
        budget = cfg.max_total_tokens - len(ids)
        if budget <= 0:
            ep.truncated, ep.stop_reason = True, StopReason.MAX_TOKENS
            break
        max_new = min(cfg.max_new_tokens, budget)
        sampling = cfg.turn_sampling(max_new, seed, member, done_turns + turn)
        t0 = time.perf_counter()
        try:
            gen = await _by(deadline, policy.generate(tuple(ids), sampling))
            gen = _check_generation(gen, renderer.vocab_size, max_new)
            if gen.finish_reason is FinishReason.STOP and not renderer.is_stop(gen.token_ids[-1]):
                last = gen.token_ids[-1]
                raise PolicyError(
                    f"the policy stopped on token {last} ({renderer.decode([last])!r}), which the "
                    f"renderer does not treat as a stop token {renderer.stop_token_ids}; give both "
                    "the same stop_token_ids"
                )
        except _DeadlinePassed:
            timings["generate"] += time.perf_counter() - t0
            out_of_time(f"while the policy generated turn {turn}")
            break
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
            ep.stop_reason = StopReason.MAX_TOKENS if max_new < cfg.max_new_tokens else StopReason.TURN_TOKENS
            break

        t0 = time.perf_counter()
        ep.actions.append(text)
        try:
            result = as_step_result(
                await _by(deadline, env.step(Action(text=text, token_ids=tuple(sampled))))
            )
        except _DeadlinePassed:
            timings["env"] += time.perf_counter() - t0
            messages.append(Message("assistant", text))
            out_of_time(f"while the env stepped turn {turn} (its tool calls or grade were cancelled)")
            break
        except Exception as e:
            timings["env"] += time.perf_counter() - t0
            messages.append(Message("assistant", text))
            fail(type(e).__name__, str(e), turn, infra_stop_reason(e))
            break
        timings["env"] += time.perf_counter() - t0
        new_obs = result.observation if result.compact is None else ()
        messages.append(result.assistant_message or Message("assistant", text))
        rewards.append(result.reward)
        ep.reward_terms.extend(dataclasses.replace(t, turn=turn) for t in result.reward_terms)
        ep.tool_records.extend(result.tool_calls)
        first_obs_index = len(messages)
        messages.extend(new_obs)
        infra_error = result.infra_error
        if infra_error is not None:
            fail("SandboxError", infra_error, turn, StopReason.SANDBOX_ERROR)
            break
        if result.terminated:
            ep.terminated, ep.stop_reason = True, StopReason.TERMINATED
            break
        if result.truncated:
            ep.truncated, ep.stop_reason = True, StopReason.ENV_TRUNCATED
            break
        if done_turns + turn + 1 >= cfg.max_turns:
            ep.truncated, ep.stop_reason = True, StopReason.MAX_TURNS
            break
        if result.compact is not None:  # this sample ends; the episode goes on in a fresh context
            if samples is None:
                fail("EnvContractError", _NO_SINK, turn, StopReason.ENV_ERROR)
                break
            ep.stop_reason = StopReason.COMPACTED
            finish()
            done_turns += turn + 1
            ep = _Episode(start_version=int(getattr(policy, "version", 0)))
            timings, pieces, messages, rewards, fail = ep.timings, ep.pieces, ep.messages, ep.rewards, ep.fail
            slot = samples.begin()
            messages.extend(result.compact)
            history = list(result.compact)
            t0 = time.perf_counter()
            try:
                prompt = renderer.render_prompt(result.compact, tools=tools)
            except TemplateError as e:
                timings["render"] += time.perf_counter() - t0
                if cfg.on_template_mismatch == "raise":
                    raise
                ep.truncated = True
                fail("TemplateError", str(e), -1, StopReason.TEMPLATE_MISMATCH, infra=False)
                break
            timings["render"] += time.perf_counter() - t0
            pieces.extend(prompt.pieces)
            ids, prefix_text, turn = list(prompt.token_ids), prompt.text, 0
            continue

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


_NO_SINK = (
    "the env compacted the context (StepResult.compact), which starts a new sample; run it with "
    "agentrl.samples.run_samples (the trainer's scheduler does), which collects every sample"
)


_T = TypeVar("_T")


class _DeadlinePassed(Exception):
    """The episode's ``episode_timeout`` passed while it awaited a step (internal to :func:`run_episode`)."""


async def _by(deadline: float | None, step: Awaitable[_T]) -> _T:
    """Await ``step``, cancelled at ``deadline`` (the event loop's clock); raises :class:`_DeadlinePassed`."""
    if deadline is None:
        return await step
    timer = asyncio.timeout_at(deadline)
    try:
        async with timer:
            return await step
    except TimeoutError:
        if timer.expired():  # ours, not a TimeoutError the step raised itself
            raise _DeadlinePassed from None
        raise


def _deadline_text(cfg: RolloutConfig) -> str:
    return f"the episode's deadline (episode_timeout={cfg.episode_timeout} s) passed"


def infra_stop_reason(e: BaseException) -> StopReason:
    """The stop reason of an episode ended by ``e``: judge_error, sandbox_error, else env_error."""
    if isinstance(e, JudgeError):
        return StopReason.JUDGE_ERROR
    return StopReason.SANDBOX_ERROR if isinstance(e, SandboxError) else StopReason.ENV_ERROR


@dataclass
class _Episode:
    """What one episode has accumulated so far (internal and mutable; the result is a frozen Trajectory)."""

    start_version: int
    pieces: list[Piece] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    tool_records: list[ToolRecord] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    reward_terms: list[RewardTerm] = field(default_factory=list)
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
        meta = dataclasses.replace(
            meta,
            env_id=meta.env_id or (env.spec_id or type(env).__name__),
            seed=meta.seed if meta.seed is not None else seed,
            policy_version=self.start_version,  # build_trajectory: the oldest turn's, if any turn ran
            episode_id=meta.episode_id or uuid.uuid4().hex,
        )
        # An env that offers tools names the format it reads them in; the trainer's tool-use alarm needs it
        # to tell "the model made no call" from "the model's calls were in a format nobody read".
        fmt = getattr(env, "tool_format", None)
        extra = dict(meta.extra)
        if isinstance(fmt, str) and fmt:
            extra.setdefault("tool_format", fmt)
        # What a deployment re-rendering this chat would show the model next to what it sampled from.
        extra.setdefault("template_history", renderer.history_policy)
        meta = dataclasses.replace(meta, extra=extra)
        self.timings["total"] = time.perf_counter() - self.t_start
        traj = build_trajectory(
            self.pieces,
            messages=self.messages,
            meta=meta,
            rewards=self.rewards,
            stop_reason=self.stop_reason,
            terminated=self.terminated,
            truncated=self.truncated,
            versions=self.versions,
            tool_calls=self.tool_records,
            actions=self.actions,
            errors=self.errors,
            timings=self.timings,
            tokenizer=renderer.tokenizer_info,
        )
        if self.reward_terms:
            traj = dataclasses.replace(traj, reward_terms=tuple(self.reward_terms))
        if cfg.audit:
            from agentrl.audit import audit_trajectory

            audit_trajectory(traj, renderer)
        return traj
