"""run_episode / run_group / run_groups / collect with scripted policies, the registered envs and small
test envs. Every trajectory goes through the token audit. Pitfalls of anchors §15 have named tests."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import pytest

import agentrl
from agentrl import Env, JsonlStore, Message, StepResult, TrajectoryGroup
from agentrl.audit import audit_trajectory
from agentrl.errors import AuditError, ConfigError, PolicyError, SandboxError, TemplateError
from agentrl.protocols import FinishReason, Generation
from agentrl.rollout import EpisodeDone, RolloutConfig, collect, run_episode, run_group, run_groups
from agentrl.testing import EchoEnv, MemoryStore, ScriptedPolicy
from agentrl.types import (
    Segment,
    StopReason,
    TokenSource,
    ToolCall,
    ToolRecord,
    ToolStatus,
    Trajectory,
)

IM_END, IM_START, NL = 2, 1, 198
CFG = RolloutConfig(max_turns=4, max_new_tokens=64, audit=True)


def turn(renderer, text: str, stop: bool = True) -> list[int]:
    return [*renderer.encode(text), IM_END] if stop else renderer.encode(text)


def scripted(renderer, *texts: str) -> ScriptedPolicy:
    return ScriptedPolicy([turn(renderer, t) for t in texts], stop_ids=renderer.stop_token_ids)


def model_turns(traj: Trajectory) -> list[tuple[int, ...]]:
    return [traj.token_ids[s.start : s.end] for s in traj.segments if s.source is TokenSource.MODEL]


# -------------------------------------------------------------------------------------------------
async def test_single_turn_echo(renderer):
    env = EchoEnv()
    _, info = await env.reset(seed=3)
    policy = scripted(renderer, info["answer"])
    traj = await run_episode(EchoEnv(), policy, renderer, CFG, seed=3)
    assert traj.terminated and not traj.truncated and traj.stop_reason is StopReason.TERMINATED
    assert traj.rewards == (1.0,) and not traj.infra_failure
    assert traj.messages[-1] == Message("assistant", info["answer"])
    assert traj.actions == (info["answer"],)  # exactly what env.step received, for replay
    assert model_turns(traj) == [tuple(turn(renderer, info["answer"]))]
    assert traj.meta.seed == 3 and traj.meta.episode_id and traj.meta.env_id == "EchoEnv"
    assert set(traj.timings) >= {"generate", "env", "render", "total"}
    audit_trajectory(traj, renderer)


async def test_multi_turn_prompt_at_each_turn_is_the_trajectory_prefix(renderer):
    """Token in / token out: what the policy saw at turn k is exactly the trajectory up to that turn."""
    policy = scripted(renderer, "50", "25", "12")
    traj = await run_episode(agentrl.make("guess-number-v0"), policy, renderer, CFG, seed=1)
    assert traj.num_turns == len(policy.calls) == 4 and traj.stop_reason is StopReason.MAX_TURNS
    assert traj.actions == ("50", "25", "12", "50")
    starts = [s.start for s in traj.segments if s.source is TokenSource.MODEL]
    for k, prompt in enumerate(policy.calls):
        assert prompt == traj.token_ids[: starts[k]]
    # One-pass render of the recorded conversation gives the same tokens (no tool calls here).
    text = renderer.render_text(traj.messages[: 2 * traj.num_turns], add_generation_prompt=False)
    assert renderer.decode(traj.token_ids) == text.removesuffix("\n")


async def test_pitfall_1_retokenization_is_not_identity(renderer):
    """§15.1: the sampled ids for "hello" are a valid but non-canonical split ("hel" + "lo"). They stay in
    the trajectory as sampled and the next prompt carries them; re-tokenizing would have changed them."""
    odd = [*renderer.encode("hel"), *renderer.encode("lo")]
    assert renderer.encode(renderer.decode(odd)) != odd  # precondition: BPE would re-split it
    sampled = [*odd, IM_END]
    policy = ScriptedPolicy([sampled], stop_ids=renderer.stop_token_ids)
    traj = await run_episode(agentrl.make("guess-number-v0"), policy, renderer, CFG, seed=0)
    assert model_turns(traj)[0] == tuple(sampled)
    assert policy.calls[1][len(policy.calls[0]) : len(policy.calls[0]) + len(sampled)] == tuple(sampled)
    assert traj.messages[1].content == "hello"
    audit_trajectory(traj, renderer)


class ToolCallEnv(Env):
    """Parses <tool_call>{json}</tool_call> from the model's text (as a tool env would) and answers with a
    tool message. The parsed assistant message has the call removed from its content."""

    CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)

    def __init__(self, turns: int = 2):
        self.turns = turns
        self.parsed: list[Message] = []

    def parse(self, text: str) -> Message:
        calls = []
        for k, raw in enumerate(self.CALL.findall(text)):
            d = json.loads(raw)
            calls.append(ToolCall(f"call_{k}", d["name"], json.dumps(d["arguments"])))
        return Message("assistant", self.CALL.sub("", text).strip(), tool_calls=tuple(calls))

    async def reset(self, *, seed=None, options=None):
        self.seed(seed)
        self.n = 0
        return (Message("user", "Add 2 and 3 with the tool."),), {}

    async def step(self, action):
        self.n += 1
        msg = self.parse(action.text)
        self.parsed.append(msg)
        records = tuple(
            ToolRecord(c.id, c.name, c.arguments, "5", ToolStatus.OK, 0.001, self.n - 1)
            for c in msg.tool_calls
        )
        obs = tuple(Message("tool", "5", tool_call_id=c.id, name=c.name) for c in msg.tool_calls)
        done = self.n >= self.turns
        return StepResult(() if done else obs, float(done), done, assistant_message=msg, tool_calls=records)


CALL_TEXT = 'Let me add.\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


async def test_pitfall_2_tool_call_extraction_does_not_touch_tokens(renderer):
    """§15.2: the env rewrites the assistant content when it extracts the call; the token stream keeps
    what was sampled, and the next prompt renders the sampled text, not the rewritten message."""
    env = ToolCallEnv()
    sampled = turn(renderer, CALL_TEXT)
    policy = ScriptedPolicy([sampled, turn(renderer, "It is 5.")], stop_ids=renderer.stop_token_ids)
    traj = await run_episode(env, policy, renderer, CFG)
    parsed = traj.messages[1]
    assert parsed is env.parsed[0] and parsed.content == "Let me add." and parsed.tool_calls[0].name == "add"
    assert model_turns(traj)[0] == tuple(sampled)
    assert policy.calls[1][: len(policy.calls[0]) + len(sampled)] == (*policy.calls[0], *sampled)
    assert "<tool_call>" in renderer.decode(policy.calls[1])
    assert traj.tool_calls[0].name == "add" and traj.messages[2].role == "tool"
    obs = [s for s in traj.segments if s.source is TokenSource.OBSERVATION]
    assert [s.message_index for s in obs] == [2]
    audit_trajectory(traj, renderer)


async def test_pitfall_3_separator_after_eos_is_masked(renderer):
    """§15.3: the "\\n" the template writes after each sampled <|im_end|> has mask 0 and no log-prob."""
    traj = await run_episode(
        agentrl.make("guess-number-v0"), scripted(renderer, "50", "25"), renderer, CFG, seed=1
    )
    model_segs = [s for s in traj.segments if s.source is TokenSource.MODEL]
    assert len(model_segs) >= 2
    for s in model_segs[:-1]:
        assert traj.token_ids[s.end - 1] == IM_END
        nxt = traj.segments[traj.segments.index(s) + 1]
        assert nxt.source is TokenSource.TEMPLATE
        assert traj.token_ids[nxt.start] == NL
        assert traj.loss_mask[nxt.start] == 0 and traj.logprobs[nxt.start] is None


DROP_THINKING = (
    "{% for m in messages %}{% set c = m['content'] %}"
    "{% if m['role'] == 'assistant' and not loop.last %}{% set c = c.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


async def test_pitfall_4_non_append_only_template_raises_or_stops(tok):
    """§15.4: a template that drops earlier reasoning is detected; the rollout raises or stops, as set."""
    from agentrl.chat import ChatRenderer

    r = ChatRenderer(tok, chat_template=DROP_THINKING)
    policy = ScriptedPolicy([turn(r, "<think>hmm</think>50")], stop_ids=r.stop_token_ids)
    with pytest.raises(TemplateError, match="rewrites the model's turn 0"):
        await run_episode(agentrl.make("guess-number-v0"), policy, r, CFG, seed=1)
    stop = dataclasses.replace(CFG, on_template_mismatch="stop")
    traj = await run_episode(agentrl.make("guess-number-v0"), policy, r, stop, seed=1)
    assert traj.truncated and traj.stop_reason is StopReason.TEMPLATE_MISMATCH
    assert not traj.infra_failure and traj.errors[0].kind == "TemplateError"
    assert traj.num_turns == 1  # nothing after the mismatch entered the token stream
    audit_trajectory(traj, r)


class WrongIdPolicy:
    """Wraps a policy and corrupts what it returns, as a buggy engine would."""

    def __init__(self, inner, corrupt):
        self.inner, self.corrupt = inner, corrupt

    @property
    def version(self):
        return 0

    async def generate(self, prompt_ids, sampling):
        return self.corrupt(await self.inner.generate(prompt_ids, sampling))


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (
            lambda g: Generation((*g.token_ids[:-1], 10**6), g.logprobs, g.finish_reason),
            "outside the vocabulary",
        ),
        (
            lambda g: Generation((*g.token_ids[:-1], IM_START), g.logprobs, FinishReason.STOP),
            "does not treat as a stop",
        ),
        (lambda g: Generation(g.token_ids, (*g.logprobs[:-1], float("nan")), g.finish_reason), "log-prob"),
    ],
    ids=["out-of-vocab", "wrong-control-token", "nan-logprob"],
)
async def test_pitfall_5_engine_side_wrong_ids_are_policy_errors(renderer, corrupt, message):
    """§15.5: ids the engine could not have sampled are rejected at the seam and mark the episode infra."""
    policy = WrongIdPolicy(scripted(renderer, "50"), corrupt)
    traj = await run_episode(agentrl.make("guess-number-v0"), policy, renderer, CFG, seed=1)
    assert traj.stop_reason is StopReason.POLICY_ERROR and traj.infra_failure
    assert message in traj.errors[0].message
    audit_trajectory(traj, renderer)


async def test_pitfall_5_audit_catches_wrong_control_token_in_a_trajectory(renderer):
    """§15.5 at the audit: a stored trajectory whose turn-ending id was swapped for another control token."""
    traj = await run_episode(
        agentrl.make("guess-number-v0"), scripted(renderer, "50", "25"), renderer, CFG, seed=1
    )
    s = next(s for s in traj.segments if s.source is TokenSource.MODEL)
    ids = list(traj.token_ids)
    ids[s.end - 1] = IM_START  # the engine reported <|im_start|> where <|im_end|> was sampled
    with pytest.raises(AuditError, match="ends without a stop token"):
        audit_trajectory(dataclasses.replace(traj, token_ids=tuple(ids)), renderer)
    ids = list(traj.token_ids)
    ids[s.start] = IM_END  # a stop id inside the turn: the engine kept sampling past it
    with pytest.raises(AuditError, match="before the turn's end"):
        audit_trajectory(dataclasses.replace(traj, token_ids=tuple(ids)), renderer)


async def test_pitfall_6_length_accounting_and_truncation(renderer):
    """§15.6: the response length counts model tokens only; a turn cut by the per-turn cap is masked in
    as sampled, ends the episode as truncated, and the env never sees it."""
    policy = scripted(renderer, "50", "25")
    traj = await run_episode(agentrl.make("guess-number-v0"), policy, renderer, CFG, seed=1)
    assert traj.num_model_tokens == sum(len(t) for t in model_turns(traj))
    assert traj.num_model_tokens < len(traj.token_ids) - len(policy.calls[0])  # observations not counted

    class Counting(EchoEnv):
        steps = 0

        async def step(self, action):
            Counting.steps += 1
            return await super().step(action)

    long = ScriptedPolicy(
        [renderer.encode("one two three four five six seven eight nine ten")],
        stop_ids=renderer.stop_token_ids,
    )
    cfg = dataclasses.replace(CFG, max_new_tokens=4)
    traj = await run_episode(Counting(), long, renderer, cfg, seed=0)
    assert traj.truncated and not traj.terminated and traj.stop_reason is StopReason.TURN_TOKENS
    assert Counting.steps == 0 and traj.rewards == ()
    assert traj.num_model_tokens == 4 and traj.loss_mask[-4:] == (1, 1, 1, 1)
    assert all(lp is not None for lp in traj.logprobs[-4:])
    # Passing the cut turn off as a normal ending is what the audit rejects.
    with pytest.raises(AuditError, match="cut by length"):
        audit_trajectory(
            dataclasses.replace(traj, truncated=False, stop_reason=StopReason.TERMINATED), renderer
        )


async def test_pitfall_6_total_token_budget(renderer):
    policy = scripted(renderer, "50", "25")
    prompt_len = len(
        renderer.render_prompt((await agentrl.make("guess-number-v0").reset(seed=1))[0]).token_ids
    )
    cfg = dataclasses.replace(CFG, max_turns=8, max_total_tokens=prompt_len + 20)
    traj = await run_episode(agentrl.make("guess-number-v0"), policy, renderer, cfg, seed=1)
    assert traj.truncated and traj.stop_reason is StopReason.MAX_TOKENS
    assert len(traj.token_ids) <= cfg.max_total_tokens
    # A budget smaller than the next turn cuts the generation itself: MAX_TOKENS, masked in.
    cfg = dataclasses.replace(CFG, max_total_tokens=prompt_len + 1)
    traj = await run_episode(agentrl.make("guess-number-v0"), policy, renderer, cfg, seed=1)
    assert traj.stop_reason is StopReason.MAX_TOKENS and traj.num_model_tokens == 1
    assert len(traj.token_ids) == cfg.max_total_tokens


async def test_pitfall_7_one_parser_for_eval_and_train(renderer):
    """§15.7: the rollout has no tool-call parser; train and eval both record what the env's own parser
    produced (the same parser object), so they cannot drift apart."""
    env = ToolCallEnv(turns=1)
    train = dataclasses.replace(CFG, temperature=1.0)
    evaluation = dataclasses.replace(CFG, temperature=0.1)
    recorded = []
    for cfg in (train, evaluation):
        traj = await run_episode(
            env, ScriptedPolicy([turn(renderer, CALL_TEXT)], stop_ids=renderer.stop_token_ids), renderer, cfg
        )
        recorded.append(traj.messages[1])
    assert recorded[0] is env.parsed[0] and recorded[1] is env.parsed[1]
    assert recorded[0] == recorded[1]
    import agentrl.episode
    import agentrl.rollout

    for module in (agentrl.episode, agentrl.rollout):
        assert not any("tool_call" in name.lower() or "parse" in name.lower() for name in vars(module))


async def test_pitfall_8_mask_logprob_alignment_after_edits(renderer):
    """§15.8: inserting or removing a boundary token without fixing the columns is caught by the audit."""
    traj = await run_episode(
        agentrl.make("guess-number-v0"), scripted(renderer, "50", "25"), renderer, CFG, seed=1
    )
    audit_trajectory(traj, renderer)
    sep = next(s for s in traj.segments if s.source is TokenSource.TEMPLATE and s.turn == 0)
    # (a) the separator gets mask 1 (as if sampled)
    mask = list(traj.loss_mask)
    mask[sep.start] = 1
    with pytest.raises(AuditError, match="loss_mask"):
        audit_trajectory(dataclasses.replace(traj, loss_mask=tuple(mask)), renderer)
    # (b) the separator gets a log-prob
    lps = list(traj.logprobs)
    lps[sep.start] = -0.1
    with pytest.raises(AuditError, match="not sampled but has a log-prob"):
        audit_trajectory(dataclasses.replace(traj, logprobs=tuple(lps)), renderer)
    # (c) the separator is removed from the ids only
    ids = traj.token_ids[: sep.start] + traj.token_ids[sep.end :]
    with pytest.raises(AuditError, match="length mismatch"):
        audit_trajectory(dataclasses.replace(traj, token_ids=ids), renderer)
    # (d) removed consistently from all columns but the segments still claim it
    cut = slice(sep.start, sep.end)
    drop = lambda xs: xs[: cut.start] + xs[cut.stop :]  # noqa: E731
    edited = dataclasses.replace(
        traj, token_ids=drop(traj.token_ids), loss_mask=drop(traj.loss_mask), logprobs=drop(traj.logprobs)
    )
    with pytest.raises(AuditError):
        audit_trajectory(edited, renderer)
    # (e) a model segment shifted by one token: its text no longer matches the message
    segs = list(traj.segments)
    k = next(i for i, s in enumerate(segs) if s.source is TokenSource.MODEL)
    m = segs[k]
    segs[k - 1] = dataclasses.replace(segs[k - 1], end=m.start + 1)
    segs[k] = Segment(m.source, m.start + 1, m.end, m.turn, m.message_index)
    mask = list(traj.loss_mask)
    lps = list(traj.logprobs)
    mask[m.start], lps[m.start] = 0, None
    with pytest.raises(AuditError, match="decode to"):
        audit_trajectory(
            dataclasses.replace(traj, segments=tuple(segs), loss_mask=tuple(mask), logprobs=tuple(lps)),
            renderer,
        )


# -------------------------------------------------------------------------------------------------
class BrokenEnv(Env):
    def __init__(self, where: str, exc: Exception | None = None):
        self.where = where
        self.exc = exc or RuntimeError("env exploded")

    async def reset(self, *, seed=None, options=None):
        if self.where == "reset":
            raise self.exc
        return (Message("user", "hi"),), {}

    async def step(self, action):
        if self.where == "step":
            raise self.exc
        if self.where == "contract":
            return "not a tuple"
        if self.where == "sandbox-record":
            rec = ToolRecord("c0", "python", "{}", "", ToolStatus.SANDBOX_ERROR, 0.1, 0, detail="bwrap died")
            return StepResult((Message("tool", "error"),), tool_calls=(rec,))
        if self.where == "gymnasium-tuple":  # the 5-tuple is read as a StepResult without records
            return (Message("user", "again"),), 0.0, False, False, {"mine": 1}
        return StepResult((Message("user", "again"),))


@pytest.mark.parametrize(
    "where, exc, reason",
    [
        ("reset", None, StopReason.ENV_ERROR),
        ("step", None, StopReason.ENV_ERROR),
        ("contract", None, StopReason.ENV_ERROR),
        ("step", SandboxError("sandbox crashed"), StopReason.SANDBOX_ERROR),
        ("sandbox-record", None, StopReason.SANDBOX_ERROR),
    ],
)
async def test_failures_are_recorded_as_infra_never_as_reward_zero(renderer, where, exc, reason):
    traj = await run_episode(BrokenEnv(where, exc), scripted(renderer, "x"), renderer, CFG, seed=0)
    assert traj.stop_reason is reason and traj.infra_failure
    assert traj.errors and traj.errors[0].infra
    assert not traj.terminated
    if where == "reset":
        assert traj.token_ids == () and traj.errors[0].turn == -1
    else:
        assert traj.num_turns == 1 and traj.messages[1].role == "assistant"
    audit_trajectory(traj, renderer)
    # The trainer-facing record says so explicitly.
    assert Trajectory.from_dict(json.loads(traj.to_json())).infra_failure


async def test_policy_error_is_recorded(renderer):
    class Down:
        version = 3

        async def generate(self, prompt_ids, sampling):
            raise PolicyError("server down")

    traj = await run_episode(EchoEnv(), Down(), renderer, CFG, seed=0)
    assert traj.stop_reason is StopReason.POLICY_ERROR and traj.infra_failure
    assert traj.errors[0].message == "server down" and traj.meta.policy_version == 3
    audit_trajectory(traj, renderer)


async def test_turn_and_env_limits(renderer):
    """The rollout owns the turn limit (max_turns); an env's own rule is env_truncated."""
    for kind in ("none", "gymnasium-tuple"):
        traj = await run_episode(
            BrokenEnv(kind), scripted(renderer, "a"), renderer, dataclasses.replace(CFG, max_turns=3), seed=0
        )
        assert traj.stop_reason is StopReason.MAX_TURNS and traj.truncated and traj.num_turns == 3
        assert traj.rewards == (0.0, 0.0, 0.0) and not traj.infra_failure
        assert traj.messages[1] == Message("assistant", "a")  # no parsed message: the turn's plain text
        audit_trajectory(traj, renderer)
    # guess-number truncates itself after max_guesses
    env = agentrl.make("guess-number-v0", max_guesses=2)
    traj = await run_episode(env, scripted(renderer, "1000"), renderer, CFG, seed=0)
    assert traj.stop_reason is StopReason.ENV_TRUNCATED and traj.truncated and traj.num_turns == 2


async def test_per_turn_sampling_seeds_are_derived(renderer):
    seen = []

    class Spy(ScriptedPolicy):
        async def generate(self, prompt_ids, sampling):
            seen.append(sampling.seed)
            return await super().generate(prompt_ids, sampling)

    cfg = dataclasses.replace(CFG, max_new_tokens=8, seed=7)
    await run_group(
        lambda: BrokenEnv("none"),
        Spy([turn(renderer, "a")], stop_ids=renderer.stop_token_ids),
        renderer,
        dataclasses.replace(cfg, max_turns=2),
        group_size=2,
        seed=5,
    )
    assert len(seen) == 4 and len(set(seen)) == 4


# -------------------------------------------------------------------------------------------------
async def test_group_shares_task_and_group_id(renderer):
    policy = scripted(renderer, "50", "25", "75")
    group = await run_group("guess-number-v0", policy, renderer, CFG, group_size=3, seed=11)
    assert isinstance(group, TrajectoryGroup) and len(group) == 3
    assert group.task_id == "guess-number-v0:11" and group.group_id == group[0].meta.group_id
    assert len({t.meta.group_id for t in group}) == 1 and group[0].meta.group_id
    assert {t.meta.task_id for t in group} == {"guess-number-v0:11"}
    assert len({t.meta.episode_id for t in group}) == 3
    assert len({t.messages[0] for t in group}) == 1  # same task
    for t in group:
        audit_trajectory(t, renderer)


async def test_run_groups_bounded_concurrency_and_streaming(renderer):
    in_flight = peak = 0

    class Slow(ScriptedPolicy):
        async def generate(self, prompt_ids, sampling):
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.001)
            in_flight -= 1
            return await super().generate(prompt_ids, sampling)

    policy = Slow([turn(renderer, "50")], stop_ids=renderer.stop_token_ids)
    cfg = dataclasses.replace(CFG, concurrency=3, max_turns=2)
    got = [
        d.trajectory
        async for d in run_groups("guess-number-v0", policy, renderer, cfg, seeds=range(5), group_size=2)
    ]
    assert len(got) == 10 and peak <= 3 and peak >= 2
    groups = {}
    for t in got:
        groups.setdefault(t.meta.group_id, []).append(t)
    assert sorted(len(v) for v in groups.values()) == [2] * 5
    assert sorted({t.meta.seed for t in got}) == list(range(5))


async def test_run_groups_reports_every_episode_and_each_group_once(renderer):
    """One stream, both granularities: an event per finished episode; the one that completes its group
    carries the group, whose members are exactly the group's earlier events, in finishing order."""
    policy = scripted(renderer, "50")
    events = [
        d async for d in run_groups("exact-answer-v0", policy, renderer, CFG, seeds=[1, 2, 3], group_size=2)
    ]
    assert len(events) == 6 and all(isinstance(d, EpisodeDone) for d in events)
    groups = [d.group for d in events if d.group is not None]
    assert sorted(g[0].meta.seed for g in groups) == [1, 2, 3]
    for k, d in enumerate(events):
        if d.group is None:
            continue
        assert d.group[-1] is d.trajectory  # the episode that completed it
        earlier = [e.trajectory for e in events[: k + 1] if e.trajectory.meta.group_id == d.group.group_id]
        assert list(d.group) == earlier


async def test_run_groups_surfaces_template_errors(tok):
    from agentrl.chat import ChatRenderer

    r = ChatRenderer(tok, chat_template=DROP_THINKING)
    policy = ScriptedPolicy([turn(r, "<think>a</think>5")], stop_ids=r.stop_token_ids)
    with pytest.raises(TemplateError):
        async for _ in run_groups("guess-number-v0", policy, r, CFG, seeds=range(3), group_size=2):
            pass


async def test_collect_writes_audited_trajectories(renderer, tmp_path):
    store = JsonlStore(tmp_path / "rollouts.jsonl")
    groups = await collect(
        "exact-answer-v0",
        scripted(renderer, "Answer: 7"),
        renderer,
        n_groups=3,
        group_size=2,
        store=store,
        config=CFG,
        seed=10,
    )
    assert [len(g) for g in groups] == [2, 2, 2]
    trajs = [t for g in groups for t in g]
    back = list(store.read())
    assert sorted(t.meta.episode_id for t in back) == sorted(t.meta.episode_id for t in trajs)
    for t in back:
        audit_trajectory(t, renderer)
        assert t.token_ids == next(x for x in trajs if x.meta.episode_id == t.meta.episode_id).token_ids
    mem = MemoryStore()
    await collect(
        EchoEnv, scripted(renderer, "apple"), renderer, n_groups=1, group_size=2, store=mem, config=CFG
    )
    assert len(mem.trajectories) == 2 and [len(g) for g in mem.read_groups(size=2)] == [2]
    # The store streams the same groups back, member for member.
    assert [[t.meta.episode_id for t in g] for g in store.read_groups(size=2)] == [
        [t.meta.episode_id for t in g] for g in groups
    ]
    store.close()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_turns=0), "max_turns"),
        (dict(max_total_tokens=-1), "max_total_tokens"),
        (dict(concurrency=True), "concurrency"),
        (dict(on_template_mismatch="branch"), "on_template_mismatch"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=0.0), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(seed="7"), "seed"),
        (dict(audit="yes"), "audit"),
    ],
)
def test_config_is_validated(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        RolloutConfig(**kwargs)


async def test_bad_group_arguments(renderer):
    with pytest.raises(ConfigError, match="group_size"):
        await run_group("exact-answer-v0", scripted(renderer, "1"), renderer, CFG, group_size=0, seed=0)
    with pytest.raises(agentrl.errors.EnvNotFoundError):
        await run_group("nope-v0", scripted(renderer, "1"), renderer, CFG, group_size=1, seed=0)


async def test_stopping_early_closes_every_env(renderer):
    opened, closed = [], []

    class Tracked(EchoEnv):
        def __init__(self):
            opened.append(self)

        async def close(self):
            closed.append(self)

    class Slow(ScriptedPolicy):
        async def generate(self, prompt_ids, sampling):
            await asyncio.sleep(0.01)
            return await super().generate(prompt_ids, sampling)

    policy = Slow([turn(renderer, "x")], stop_ids=renderer.stop_token_ids)
    cfg = dataclasses.replace(CFG, concurrency=4)
    gen = run_groups(Tracked, policy, renderer, cfg, seeds=range(100), group_size=2)
    async for _ in gen:
        break
    await gen.aclose()
    assert opened and len(closed) == len(opened)
    await asyncio.sleep(0.05)
    assert len(opened) < 20  # no group kept starting in the background


async def test_env_tools_reach_the_template(tok):
    from agentrl.chat import ChatRenderer

    with_tools = (
        "{% if tools %}{{ '<|im_start|>system\\nTools: ' + (tools | map(attribute='function') "
        "| map(attribute='name') | join(',')) + '<|im_end|>\\n' }}{% endif %}"
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    r = ChatRenderer(tok, chat_template=with_tools)

    class WithTools(EchoEnv):
        tools = (agentrl.testing.EchoTool.schema,)

    policy = ScriptedPolicy([turn(r, "x")], stop_ids=r.stop_token_ids)
    traj = await run_episode(WithTools(), policy, r, CFG, seed=0)
    assert "Tools: echo" in r.decode(traj.token_ids)
    audit_trajectory(traj, r)


async def test_turns_ending_on_another_eos_stay_append_only(renderer):
    """The model may stop on <|endoftext|> (a stop id) where ChatML closes turns with <|im_end|>: the
    sampled token stays, the template's closing follows as TEMPLATE, and later turns still extend."""
    eot = 0
    policy = ScriptedPolicy(
        [[*renderer.encode("50"), eot], [*renderer.encode("25"), eot]], stop_ids=renderer.stop_token_ids
    )
    traj = await run_episode(agentrl.make("guess-number-v0"), policy, renderer, CFG, seed=1)
    assert traj.num_turns == 4 and traj.stop_reason is StopReason.MAX_TURNS
    assert all(t[-1] == eot for t in model_turns(traj))
    sep = next(s for s in traj.segments if s.source is TokenSource.TEMPLATE and s.turn == 0)
    assert renderer.decode(traj.token_ids[sep.start : sep.end]) == "<|im_end|>\n"
    assert traj.messages[1].content == "50"
    audit_trajectory(traj, renderer)
