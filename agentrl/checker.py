"""``check_env``: does an environment honour the agentrl ``Env`` contract?

Checks, in order: ``reset`` returns ``(tuple[Message, ...], dict)``; the same seed gives the same first
observation; different seeds are not all identical (a warning only: some envs have one task); ``step``
returns a valid :class:`~agentrl.env.StepResult` (or Gymnasium's 5-tuple, read by
:func:`~agentrl.env.as_step_result`): a tuple of messages, a finite reward, bool flags, an assistant message
and tool records of the right types; bad actions (empty text, garbage, a malformed tool call) are answered,
not raised; the env's own :meth:`~agentrl.Env.sample_actions` (a right episode, where it declares one)
runs its tools without a failure and scores above 0; a seeded episode with plain-text answers ends (else a
warning); a seeded episode is reproducible step by step. A tool call that ends with ``sandbox_error`` in any
of these steps fails the check with :class:`~agentrl.errors.SandboxError`: the sandbox could not run the
code here (it failed its self-test, or could not start), which a training run would meet on every episode.

A ``step`` that raises is reported as an environment error: the rollout would end such episodes as
``env_error`` and never train on them. That is right only when the env itself is broken; a bad action must
be answered with a message and a reward.
"""

from __future__ import annotations

import warnings
from typing import Any

from agentrl._sync import run_sync
from agentrl.env import Env, StepResult, as_step_result
from agentrl.errors import EnvContractError, SandboxError
from agentrl.types import Action, Message, ToolStatus

__all__ = ["acheck_env", "check_env"]

BAD_ACTIONS = (
    "",
    "   \n\t",
    "\x00\x01 garbage }{ ]] <tool_call>{not json</tool_call>",
    '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
    "```python\nraise SystemExit(3)\n```",
    "x" * 5000,
)


def check_env(env: Env, *, max_steps: int = 64, seed: int = 1234) -> None:
    """Synchronous form of :func:`acheck_env`."""
    run_sync(acheck_env(env, max_steps=max_steps, seed=seed))


async def acheck_env(env: Env, *, max_steps: int = 64, seed: int = 1234) -> None:
    """Raise :class:`EnvContractError` naming the first broken rule; warn about soft issues."""
    if not isinstance(env, Env):
        raise EnvContractError(f"check_env needs an agentrl.Env, got {type(env).__name__}")
    name = type(env).__name__

    obs1, _ = await _reset(env, seed)
    obs2, _ = await _reset(env, seed)
    if obs1 != obs2:
        raise EnvContractError(f"{name}.reset(seed={seed}) gave different observations twice")
    others = {(await _reset(env, seed + k))[0] for k in range(1, 6)}
    if len(others | {obs1}) == 1:
        warnings.warn(f"{name}: six seeds gave the same first observation", stacklevel=2)

    for action_text in BAD_ACTIONS:
        await _reset(env, seed)
        await _step(env, Action(text=action_text), name)

    await _sample_episode(env, seed, name)

    trace1 = await _episode(env, seed, max_steps, name)
    trace2 = await _episode(env, seed, max_steps, name)
    if trace1 != trace2:
        raise EnvContractError(f"{name}: the same seed and actions gave a different episode")


async def _reset(env: Env, seed: int) -> tuple[tuple[Message, ...], dict[str, Any]]:
    out = await env.reset(seed=seed)
    name = type(env).__name__
    if not (isinstance(out, tuple) and len(out) == 2):
        raise EnvContractError(f"{name}.reset must return (observation, info), got {out!r:.200}")
    obs, info = out
    if not isinstance(obs, tuple) or not obs or not all(isinstance(m, Message) for m in obs):
        raise EnvContractError(f"{name}.reset observation must be a non-empty tuple of Message")
    if not isinstance(info, dict):
        raise EnvContractError(f"{name}.reset info must be a dict, got {type(info).__name__}")
    return obs, info


async def _step(env: Env, action: Action, name: str) -> StepResult:
    try:
        out = await env.step(action)
    except Exception as e:
        raise EnvContractError(
            f"environment error: {name}.step raised {type(e).__name__}: {str(e)[:200]} on the action "
            f"{action.text[:60]!r}. The rollout ends such episodes as env_error and never trains on them, "
            "which is right only when the environment itself is broken; if the action was merely bad, answer "
            "it with a message and a reward instead"
        ) from e
    try:
        res = as_step_result(out)
    except EnvContractError as e:
        raise EnvContractError(f"{name}.{e}") from None
    for c in res.tool_calls:
        if c.status is ToolStatus.SANDBOX_ERROR:
            # Infrastructure, not the env's contract: a run here would lose every episode that runs code.
            raise SandboxError(
                f"{name}: the tool call {c.name!r} could not run its code: sandbox_error: "
                f"{(c.detail or c.output)[:500]!r}. The env's tools need a sandbox that works on this host "
                "(python -m agentrl.sandbox says why the local one does not)"
            )
    return res


async def _sample_episode(env: Env, seed: int, name: str) -> None:
    """Play the env's own right episode (``sample_actions``) for the task of ``seed``, if it has one."""
    await _reset(env, seed)
    sample = env.sample_actions()
    if isinstance(sample, str) or not all(isinstance(a, str) for a in sample):
        raise EnvContractError(f"{name}.sample_actions must return a sequence of str, got {sample!r:.200}")
    if not sample:
        return
    total = 0.0
    for k, text in enumerate(sample):
        res = await _step(env, Action(text=text), name)
        for c in res.tool_calls:
            if c.status is not ToolStatus.OK:
                raise EnvContractError(
                    f"{name}: the tool call {c.name!r} of sample action {k} ended with status "
                    f"{c.status.value}: {(c.detail or c.output)[:300]!r}"
                )
        total += res.reward
        if res.terminated or res.truncated:
            if k + 1 < len(sample):
                raise EnvContractError(f"{name}: the episode ended after sample action {k} of {len(sample)}")
            break
    else:
        raise EnvContractError(f"{name}: the {len(sample)} sample actions did not end the episode")
    if not total > 0:
        raise EnvContractError(
            f"{name}: the sample actions (a right answer) scored {total}; a right answer must score above 0 "
            "(is the grader broken?)"
        )


async def _episode(env: Env, seed: int, max_steps: int, name: str) -> list[tuple[Any, ...]]:
    """Play a seeded episode with fixed plain-text actions; return what is comparable across runs."""
    obs, _ = await _reset(env, seed)
    trace: list[tuple[Any, ...]] = [obs]
    for k in range(max_steps):
        res = await _step(env, Action(text=f"{k}"), name)
        records = tuple((r.name, r.output, r.status) for r in res.tool_calls)
        trace.append(
            (res.observation, res.reward, res.terminated, res.truncated, res.assistant_message, records)
        )
        if res.terminated or res.truncated:
            return trace
    warnings.warn(
        f"{name}: no episode end within {max_steps} steps of plain answers; only the rollout's max_turns "
        "will end such episodes (end them by a rule of the task: terminated or truncated)",
        stacklevel=3,
    )
    return trace
