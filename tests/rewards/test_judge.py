"""Judges over real HTTP on loopback: the agentrl gateway serving the tiny model (a real local judge) and
scripted policies behind the same gateway for the faults (garbage, 500, timeout, slow); the cache, the
concurrency limit, rubrics, relative judging, and a judge outage as an infrastructure failure."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from agentrl.errors import ConfigError, JudgeError
from agentrl.protocols import Generation, Sampling
from agentrl.rewards import (
    Criterion,
    Grade,
    Judge,
    JudgeCache,
    OpenAIJudgeBackend,
    PolicyJudgeBackend,
    RelativeJudge,
    Rubric,
    parse_pass_fail,
    parse_score,
)
from agentrl.testing import MemoryStore, ScriptedPolicy
from agentrl.trainers.gateway import Gateway, GatewayConfig

TEMPLATE = "Question: {question}\nAnswer: {answer}\nReply 'Score: N' (0-10)."
SERVE = GatewayConfig(max_turns=100_000, max_new_tokens=64)


def scripted(renderer, texts: Sequence[str], **kw) -> ScriptedPolicy:
    end = [renderer.stop_token_ids[0]]
    return ScriptedPolicy(
        [[*renderer.encode(t), *end] for t in texts], stop_ids=renderer.stop_token_ids, **kw
    )


class Failing:
    """A policy whose generation fails ``fails`` times, then answers ``text`` (the gateway answers 500)."""

    def __init__(self, renderer, text: str, fails: int):
        self.inner, self.fails = scripted(renderer, [text]), fails

    @property
    def version(self) -> int:
        return 0

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        if self.fails > 0:
            self.fails -= 1
            raise RuntimeError("engine crashed")
        return await self.inner.generate(prompt_ids, sampling)


def judge_at(gw: Gateway, url: str | None = None, **kw) -> Judge:
    """A judge asking ``gw`` on its session-less route (``/v1/chat/completions``: nothing recorded)."""
    kw.setdefault("retries", 2)
    kw.setdefault("temperature", 0.01)  # the gateway refuses 0 (it records what the policy samples)
    kw.setdefault("deadline_s", 20.0)
    kw.setdefault("request_timeout_s", kw["deadline_s"])
    return Judge(OpenAIJudgeBackend(url or f"{gw.url}/v1", "judge"), TEMPLATE, **kw)


SAMPLE = {"question": "Describe the sea.", "answer": "Blue and wide."}


# -- a real local judge: the tiny model behind the gateway -------------------------------------------------
async def test_tiny_model_judge_over_http_records_calls_and_a_cached_rerun_sends_nothing(renderer, tmp_path):
    from agentrl.models import tiny_model
    from agentrl.policies import HFPolicy

    policy = HFPolicy(tiny_model(renderer.tokenizer, seed=0), renderer.tokenizer, stop_token_ids=[0], seed=0)

    def length_score(raw: str) -> float:  # the random model writes noise: score its length, any text reads
        return min(len(raw), 40) / 40

    samples = [{**SAMPLE, "answer": f"Blue and wide, {k}."} for k in range(3)]
    store = MemoryStore()
    async with Gateway(policy, renderer, SERVE, store=store) as gw:
        cache = tmp_path / "judge_cache.jsonl"
        kw = {"parser": length_score, "parser_name": "length", "max_tokens": 8, "deadline_s": 120.0}
        first = judge_at(gw, **kw, cache=JudgeCache(cache))
        calls = await first.judge_many(samples)
        assert first.requests == 3
        assert all(not c.cached and c.attempts == 1 and c.latency_s > 0 and c.raw for c in calls)
        assert [c.prompt for c in calls] == [TEMPLATE.format(**s) for s in samples]
        assert all(c.judge == f"judge@{gw.url}/v1" for c in calls)
        # the session-less route keeps no session open and records nothing (a judge is not training data)
        assert not gw.core.sessions and not store.trajectories
        # a re-run (new judge, new process's view of the same cache file) sends no request
        again = judge_at(gw, **kw, cache=JudgeCache(cache))
        cached = await again.judge_many(samples)
        assert again.requests == 0
        assert [(c.raw, c.score, c.cached) for c in cached] == [(c.raw, c.score, True) for c in calls]


async def test_the_shipped_fake_backend_and_a_cache_hit_in_one_process():
    from agentrl.testing import ScriptedJudgeBackend

    backend = ScriptedJudgeBackend(["Score: 3"])
    judge = Judge(backend, TEMPLATE)
    first, again = await judge.judge(SAMPLE), await judge.judge(SAMPLE)
    assert (first.score, first.cached, again.cached, len(backend.prompts)) == (0.3, False, True, 1)


async def test_in_process_policy_judge(renderer):
    backend = PolicyJudgeBackend(scripted(renderer, ["Score: 7"]), renderer, name="s@local")
    judge = Judge(backend, TEMPLATE)
    call = await judge.judge(SAMPLE)
    assert (call.score, call.raw, call.judge) == (0.7, "Score: 7", "s@local")


# -- faults: scripted policies behind the same real gateway ------------------------------------------------
async def test_garbage_answers_are_retried_then_a_judge_error(renderer):
    async with Gateway(scripted(renderer, ["I like turtles"]), renderer, SERVE) as gw:
        judge = judge_at(gw, retries=2)
        with pytest.raises(JudgeError, match="no readable answer in 3 attempt"):
            await judge.judge(SAMPLE)
        assert judge.requests == 3


async def test_garbage_then_a_score_is_a_retry_that_succeeds(renderer):
    async with Gateway(scripted(renderer, ["hmm", "Score: 9/10"]), renderer, SERVE) as gw:
        call = await judge_at(gw).judge(SAMPLE)
    assert (call.score, call.attempts) == (0.9, 2)


async def test_http_500_is_retried_and_an_outage_is_a_judge_error(renderer):
    async with Gateway(Failing(renderer, "PASS", fails=1), renderer, SERVE) as gw:
        call = await judge_at(gw, parser="pass_fail").judge(SAMPLE)
        assert (call.score, call.attempts) == (1.0, 2)
    async with Gateway(Failing(renderer, "PASS", fails=99), renderer, SERVE) as gw:
        with pytest.raises(JudgeError, match="HTTP 500"):
            await judge_at(gw, parser="pass_fail", retries=1).judge(SAMPLE)


async def test_a_judge_that_never_answers_in_time_fails_by_its_deadline(renderer):
    async with Gateway(scripted(renderer, ["Score: 5"], delay_s=5.0), renderer, SERVE) as gw:
        judge = judge_at(gw, request_timeout_s=0.3, deadline_s=1.0, retries=10)
        t0 = time.perf_counter()
        with pytest.raises(JudgeError, match=r"ReadTimeout|deadline"):
            await judge.judge(SAMPLE)
        assert time.perf_counter() - t0 < 3.0


async def test_a_slow_judge_within_its_limits_is_waited_for(renderer):
    async with Gateway(scripted(renderer, ["Score: 4"], delay_s=0.4), renderer, SERVE) as gw:
        call = await judge_at(gw, request_timeout_s=5.0).judge(SAMPLE)
    assert call.score == 0.4 and call.latency_s >= 0.4 and call.attempts == 1


async def test_a_wrong_model_endpoint_is_refused_at_once(renderer):
    async with Gateway(scripted(renderer, ["Score: 4"]), renderer, SERVE, auto_sessions=False) as gw:
        judge = judge_at(gw, url=gw.base_url("judge-{uid}"))  # a training gateway: no such session
        with pytest.raises(JudgeError, match="refused the request: HTTP 404"):
            await judge.judge(SAMPLE)
        assert judge.requests == 1


async def test_a_batch_keeps_to_the_concurrency_limit(renderer):
    inflight, peak = 0, 0

    class Counting:
        version = 0

        def __init__(self):
            self.inner = scripted(renderer, ["Score: 6"], delay_s=0.2)

        async def generate(self, prompt_ids, sampling):
            nonlocal inflight, peak
            inflight += 1
            peak = max(peak, inflight)
            try:
                return await self.inner.generate(prompt_ids, sampling)
            finally:
                inflight -= 1

    async with Gateway(Counting(), renderer, SERVE) as gw:
        judge = judge_at(gw, concurrency=2)
        calls = await judge.judge_many([{**SAMPLE, "answer": str(k)} for k in range(6)])
    assert [c.score for c in calls] == [0.6] * 6 and peak == 2


# -- parsers, rubrics, relative judging ---------------------------------------------------------------------
def test_parsers():
    assert parse_score("Reasoning... Score: 8") == 0.8
    assert parse_score("score = 3/5") == 0.6
    assert parse_score("7 - fine") == 0.7
    for bad in ("no idea", "Score: 11", "Score: 4/0"):
        with pytest.raises(ValueError):
            parse_score(bad)
    assert parse_pass_fail("Verdict: PASS") == 1.0 and parse_pass_fail("no.") == 0.0
    with pytest.raises(ValueError):
        parse_pass_fail("maybe")


async def test_rubric_weights_function_and_judge_criteria(renderer):
    async with Gateway(scripted(renderer, ["Score: 5"]), renderer, SERVE) as gw:
        judge = judge_at(gw)
        rubric = Rubric(
            [
                Criterion("short", 0.25, fn=lambda s: Grade(float(len(s["answer"]) < 20), "length")),
                Criterion("judge", 0.75, judge=judge, description="is vivid"),
            ]
        )
        result = await rubric.score(SAMPLE)
    assert [(t.name, t.score, t.weight) for t in result.terms] == [("short", 1.0, 0.25), ("judge", 0.5, 0.75)]
    assert result.reward == pytest.approx(0.25 + 0.375)
    assert result.terms[1].judge_calls[0].raw == "Score: 5"
    with pytest.raises(ConfigError):
        Criterion("x", fn=lambda s: 1.0, judge=judge)


async def test_relative_judge_scores_a_group_in_one_call(renderer):
    async with Gateway(scripted(renderer, ["Answer 1: 8\nAnswer 2: 3\nAnswer 3: 10"]), renderer, SERVE) as gw:
        judge = judge_at(gw)
        grades = await RelativeJudge(judge).score_group("Describe the sea.", ["Blue.", "Wet.", "Vast, grey."])
        assert judge.requests == 1
    assert [g.score for g in grades] == [0.8, 0.3, 1.0]
    assert len({g.judge_calls[0].key for g in grades}) == 1


async def test_judge_outage_in_an_episode_is_an_infra_failure_not_reward_zero(renderer):
    from agentrl.envs.judged import JudgedEnv
    from agentrl.episode import RolloutConfig, run_episode
    from agentrl.types import StopReason, Trajectory

    writer = scripted(renderer, ["The sea is blue."])
    cfg = RolloutConfig(max_turns=1, max_new_tokens=16)
    async with Gateway(scripted(renderer, ["Score: 8"]), renderer, SERVE) as gw:
        rubric = Rubric([Criterion("judge", judge=judge_at(gw))])
        ok = await run_episode(JudgedEnv(rubric=rubric), writer, renderer, cfg, seed=1)
    assert not ok.infra_failure and ok.reward == 0.8
    (term,) = ok.reward_terms
    assert (term.name, term.turn, term.judge_calls[0].raw) == ("judge", 0, "Score: 8")
    assert Trajectory.from_dict(ok.to_dict()).reward_terms == ok.reward_terms
    async with Gateway(Failing(renderer, "Score: 8", fails=99), renderer, SERVE) as gw:
        rubric = Rubric([Criterion("judge", judge=judge_at(gw, retries=1))])
        down = await run_episode(JudgedEnv(rubric=rubric), writer, renderer, cfg, seed=1)
    assert down.infra_failure and down.stop_reason is StopReason.JUDGE_ERROR
    assert down.rewards == () and down.errors[0].kind == "JudgeError"


def test_judged_env_without_a_judge_is_a_config_error():
    from agentrl.envs.judged import JudgedEnv

    with pytest.raises(ConfigError, match="needs a judge"):
        JudgedEnv()


def test_the_example_rubric_file_loads(tmp_path):
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "judged_rubric.json"
    rubric = Rubric.from_file(example, cache=JudgeCache(tmp_path / "c.jsonl"))
    assert [(c.name, c.weight, c.judge is not None) for c in rubric.criteria] == [
        ("follows", 0.8, True),
        ("brief", 0.2, False),
    ]
    assert rubric.judges[0].parser_name == "pass_fail"
    bad = tmp_path / "bad.json"
    bad.write_text('{"criteria": [{"name": "x", "function": "nope"}]}')
    with pytest.raises(ConfigError, match="unknown function 'nope'"):
        Rubric.from_file(bad)
