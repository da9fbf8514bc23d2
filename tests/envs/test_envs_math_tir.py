"""math-tir-v0: seeded problems, exact checking, the held-out split, and real tool-integrated episodes."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

import agentrl
from agentrl import Action, Message, ToolStatus
from agentrl.envs import math_problems
from agentrl.envs.math_tir import INSTRUCTION, MathTIREnv
from agentrl.errors import ConfigError
from agentrl.testing import FakeSandbox


def fake_env(**kwargs) -> MathTIREnv:
    return MathTIREnv(sandbox_factory=FakeSandbox, **kwargs)


async def question(env: MathTIREnv, seed: int | None, **options) -> str:
    obs, _ = await env.reset(seed=seed, options=options or None)
    problem, instruction = obs[-1].content.split("\n")
    assert instruction == INSTRUCTION
    return problem


# -- prompt ------------------------------------------------------------------------------------------
async def test_prompt_is_system_then_one_worked_example_then_the_question():
    env = agentrl.make("math-tir-v0")
    obs, info = await env.reset(seed=0)
    assert [m.role for m in obs] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert "```python" in obs[0].content and "Answer: <number>" in obs[0].content
    assert obs[2].content.startswith("```python\n") and obs[3].content.startswith("```output\n")
    assert obs[4].content == "Answer: 17273" and 487 * 36 - 259 == 17273
    assert obs[1].content.endswith(INSTRUCTION) and obs[5].content.endswith(INSTRUCTION)
    assert set(info) == {"task_id", "kind", "difficulty", "split", "answer"}
    assert info["split"] == "train" and info["difficulty"] == 1
    await env.close()


# -- seeding and the split ---------------------------------------------------------------------------
async def test_same_seed_same_problem_and_seeds_vary():
    env = fake_env(difficulty=None)
    assert await question(env, 7) == await question(env, 7)
    assert len({await question(env, s) for s in range(40)}) >= 38
    stream_a = [await question(env, 5)] + [await question(env, None) for _ in range(3)]
    stream_b = [await question(env, 5)] + [await question(env, None) for _ in range(3)]
    assert stream_a == stream_b  # reset() without a seed continues the seeded stream


async def test_splits_are_disjoint_and_options_override_the_constructor():
    env = fake_env(difficulty=1)
    train = {await question(env, s) for s in range(400)}
    test = {await question(env, s, split="test") for s in range(400)}
    assert train.isdisjoint(test)
    assert all(math_problems.split_of(q) == "train" for q in train)
    assert all(math_problems.split_of(q) == "test" for q in test)
    assert len(test) > 150  # a real held-out set, not a handful of repeats
    held_out = fake_env(split="test")
    assert math_problems.split_of(await question(held_out, 3)) == "test"
    _, info = await env.reset(seed=1, options={"difficulty": 3, "kinds": ["divisors"]})
    assert (info["difficulty"], info["kind"]) == (3, "divisors")


def test_split_is_a_fixed_fraction_of_question_space():
    rng = random.Random(0)
    questions = {math_problems.generate(rng).question for _ in range(4000)}
    share = sum(math_problems.split_of(q) == "test" for q in questions) / len(questions)
    assert abs(share - math_problems.TEST_PERCENT / 100) < 0.03


@pytest.mark.parametrize(
    "bad",
    [{"split": "dev"}, {"difficulty": 4}, {"kinds": ["calculus"]}, {"kinds": []}, {"format_reward": 1.5}],
)
def test_bad_configuration_is_rejected(bad):
    with pytest.raises(ConfigError):
        fake_env(**bad)


# -- the generators' answers -------------------------------------------------------------------------
def brute_force(kind: str, q: str) -> int | Fraction | None:
    """Independent answers for the kinds where a naive check is cheap."""
    nums = [int(t) for t in q.replace("?", " ").replace(",", " ").split() if t.isdigit()]
    if kind == "divisors":
        n = nums[0]
        return sum(1 for d in range(1, n + 1) if n % d == 0) if n < 200_000 else None
    if kind == "count_primes":
        a, b = nums[:2]
        return sum(1 for k in range(max(a, 2), b + 1) if all(k % p for p in range(2, int(k**0.5) + 1)))
    if kind == "gcd_lcm" and "greatest" in q:
        a, b = nums[:2]
        return max(d for d in range(1, min(a, b) + 1) if a % d == 0 and b % d == 0) if a < 10**5 else None
    return None


@pytest.mark.parametrize("kind", sorted(math_problems.KINDS))
@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_every_kind_and_level_generates_exact_checkable_answers(kind, difficulty):
    rng = random.Random(f"{kind}-{difficulty}")
    for _ in range(15):
        p = math_problems.generate(rng, [kind], difficulty)
        assert (p.kind, p.difficulty) == (kind, difficulty) and p.question.endswith(
            ("?", "terms.", "power.)")
        )
        assert isinstance(p.answer, int | Fraction)
        expected = brute_force(kind, p.question)
        if expected is not None:
            assert p.answer == expected, p.question
        assert len(p.task_id) == 12


# -- checking answers --------------------------------------------------------------------------------
async def answer(env: MathTIREnv, text: str, seed: int = 11, **options) -> float:
    await env.reset(seed=seed, options=options or None)
    res = await env.step(Action(text))
    assert res.terminated and not res.truncated
    return res.reward


async def test_right_answers_are_accepted_in_several_formats():
    env = fake_env()
    _, info = await env.reset(seed=11)
    n = int(info["answer"])
    for text in (
        f"Answer: {n}",
        f"The answer is {n}.",
        f"\\boxed{{{n}}}",
        f"**Answer:** {n:,}",
        f"So x = {n}.\nFinal answer: {n}",
        f"Answer: {n}.0",
    ):
        assert await answer(env, text) == 1.0, text


async def test_fractions_are_compared_exactly():
    env = fake_env()
    _, info = await env.reset(seed=4, options={"kinds": ["fractions"]})
    value = Fraction(info["answer"])
    p, q = value.numerator, value.denominator
    for text in (f"Answer: {p}/{q}", f"\\boxed{{\\frac{{{p}}}{{{q}}}}}", f"Answer: {2 * p}/{2 * q}"):
        assert await answer(env, text, seed=4, kinds=["fractions"]) == 1.0, text
    assert await answer(env, f"Answer: {p + 1}/{q}", seed=4, kinds=["fractions"]) == 0.0


async def test_wrong_missing_and_code_only_answers_are_rejected():
    env = fake_env()
    _, info = await env.reset(seed=11)
    n = int(info["answer"])
    for text in (f"Answer: {n + 1}", f"Answer: -{n}", "I don't know", f"{n} or {n + 1}", ""):
        assert await answer(env, text) == 0.0, text


async def test_format_reward_is_off_by_default_and_small_when_on():
    _, info = await fake_env().reset(seed=11)
    wrong = f"Answer: {int(info['answer']) + 1}"
    assert await answer(fake_env(), wrong) == 0.0
    shaped = fake_env(format_reward=0.1)
    assert await answer(shaped, wrong) == 0.1
    assert await answer(shaped, "no number here") == 0.0


# -- whole episodes ----------------------------------------------------------------------------------
async def play(env: MathTIREnv, seed: int) -> tuple[list[Message], float, list]:
    """A scripted solver: write python for the question, read the output, answer with it."""
    obs, _ = await env.reset(seed=seed, options={"kinds": ["arithmetic"]})
    expression = obs[-1].content.split("\n")[0].removeprefix("What is ").removesuffix("?")
    seen: list[Message] = []
    records: list = []
    res = await env.step(Action(f"Let me compute it.\n```python\nresult = {expression}\nprint(result)\n```"))
    assert not (res.terminated or res.truncated)
    seen += res.observation
    records += res.tool_calls
    printed = res.observation[0].content.removeprefix("```output\n").removesuffix("\n```")
    res = await env.step(Action(f"Answer: {printed}"))
    assert res.terminated and not res.truncated
    return seen, res.reward, records


async def test_scripted_episode_with_the_real_sandbox_gets_reward_one(local_sandbox_cls):
    env = MathTIREnv()  # default factory: agentrl.sandbox.LocalSandbox
    seen, reward, records = await play(env, seed=21)
    assert reward == 1.0
    assert seen[0].role == "tool" and seen[0].tool_call_id == "call_0_0"
    assert records[0].status is ToolStatus.OK and records[0].name == "python"
    await env.close()


async def test_python_state_persists_within_an_episode_and_is_fresh_per_episode(local_sandbox_cls):
    env = MathTIREnv()
    await env.reset(seed=1)
    await env.step(Action("```python\nmemo = 123\n```"))
    res = await env.step(Action("```python\nprint(memo * 2)\n```"))
    assert res.observation[0].content == "```output\n246\n```"
    await env.reset(seed=2)
    res = await env.step(Action("```python\nprint(memo)\n```"))
    assert "NameError" in res.observation[0].content and res.tool_calls[0].status is ToolStatus.ERROR
    await env.close()


async def test_code_errors_are_shown_and_the_model_can_recover():
    env = fake_env()
    _, info = await env.reset(seed=3, options={"kinds": ["arithmetic"]})
    res = await env.step(Action("```python\nprint(undefined_name)\n```"))
    assert not res.terminated and "NameError" in res.observation[0].content
    assert res.tool_calls[0].status is ToolStatus.ERROR
    res = await env.step(Action(f"Answer: {info['answer']}"))
    assert res.terminated and res.reward == 1.0


async def test_long_output_is_capped_for_the_model():
    env = fake_env(max_output_chars=300)
    await env.reset(seed=3)
    res = await env.step(Action("```python\nfor i in range(10_000):\n    print(i)\n```"))
    text = res.observation[0].content
    assert len(text) < 400 and "characters cut" in text and text.endswith("9999\n```")


async def test_episodes_can_borrow_sessions_from_a_sandbox_pool(local_sandbox_cls):
    from agentrl.sandbox import SandboxPool

    async with SandboxPool(local_sandbox_cls, size=1, warm=1) as pool:
        env = MathTIREnv(sandbox_pool=pool)
        await env.reset(seed=1)
        await env.step(Action("```python\nmemo = 7\n```"))
        obs = (await env.step(Action("```python\nprint(memo)\n```"))).observation
        assert obs[0].content == "```output\n7\n```"
        await env.reset(seed=2)  # gives the session back; the pool resets it
        obs = (await env.step(Action("```python\nprint(memo)\n```"))).observation
        assert "NameError" in obs[0].content
        await env.close()
        assert pool.stats.live == 1 and pool.stats.in_use == 0
