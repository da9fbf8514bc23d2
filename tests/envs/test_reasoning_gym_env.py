"""``reasoning-gym:<dataset>`` against the real reasoning-gym library: its config, its grader, the splits, the
python tool, and the errors for bad names, bad fields and a missing library."""

import asyncio
import subprocess
import sys

import pytest

import agentrl
from agentrl import Action
from agentrl._sync import run_sync
from agentrl.envs.reasoning_gym_env import (
    TEST_SEED,
    ReasoningGymEnv,
    config_fields,
    dataset_names,
    final_answer,
)
from agentrl.errors import ConfigError

reasoning_gym = pytest.importorskip(
    "reasoning_gym", reason="the reasoning-gym extra (.ci/setup --dev installs it)"
)


def play(env, seed, *turns):
    async def go():
        obs, info = await env.reset(seed=seed)
        results = [await env.step(Action(text=t)) for t in turns]
        await env.close()
        return obs, info, results

    return asyncio.run(go())


def test_every_dataset_of_the_library_is_a_member():
    names = dataset_names()
    assert {"chain_sum", "basic_arithmetic", "leg_counting"} <= set(names)
    assert names == sorted(reasoning_gym.factory.DATASETS)
    assert agentrl.registry.family_names("reasoning-gym") == names


@pytest.mark.parametrize("dataset", ["chain_sum", "basic_arithmetic", "leg_counting"])
def test_check_env_plays_the_reference_answer(dataset):
    env = agentrl.make(f"reasoning-gym:{dataset}")
    agentrl.check_env(env)  # the sample episode answers the dataset's reference: its scorer gives > 0
    run_sync(env.close())


def test_the_reward_is_the_datasets_own_score_answer():
    env = agentrl.make("reasoning-gym:chain_sum", max_terms=3)
    obs, info, _ = play(env, 5)
    assert obs[-1].content == env.entry["question"] and info["answer"] == env.entry["answer"]
    answer = env.entry["answer"]
    for text in (
        f"<answer>{answer}</answer>",
        f"so...\nAnswer: {answer}",
        f"<answer>{int(answer) + 1}</answer>",
        "no idea",
    ):
        _, _, (result,) = play(env, 5, text)
        expected = env.data.score_answer(final_answer(text), env.entry)
        assert result.reward == expected and result.terminated
    assert [
        play(env, 5, f"<answer>{answer}</answer>")[2][0].reward,
        play(env, 5, "no idea")[2][0].reward,
    ] == [1, 0]


def test_partial_credit_comes_through_as_the_library_gives_it():
    # spell_backward's scorer gives partial credit for a near miss (the library's rule, not ours).
    env = agentrl.make("reasoning-gym:spell_backward")
    play(env, 0)
    answer = env.entry["answer"]
    near = answer[:-1] + ("a" if answer[-1] != "a" else "b")
    _, _, (result,) = play(env, 0, f"<answer>{near}</answer>")
    assert result.reward == env.data.score_answer(near, env.entry)


def test_a_scorer_that_raises_on_a_malformed_answer_scores_it_zero():
    env = agentrl.make("reasoning-gym:prime_factorization")
    play(env, 0)
    with pytest.raises(ValueError):  # the library's own scorer, on words
        env.data.score_answer("no idea", env.entry)
    _, _, (result,) = play(env, 0, "<answer>no idea</answer>")
    assert result.terminated and result.reward == 0.0


def test_config_fields_come_from_env_kwargs_and_bad_ones_list_the_valid_fields():
    env = agentrl.make("reasoning-gym:chain_sum", min_terms=2, max_terms=2, max_digits=1)
    play(env, 1)
    assert env.entry["metadata"]["num_terms"] == 2
    with pytest.raises(ConfigError, match=r"no config field \['bogus'\].*min_terms=2, max_terms=6"):
        agentrl.make("reasoning-gym:chain_sum", bogus=3)
    with pytest.raises(ConfigError, match="set by the env from the split"):
        agentrl.make("reasoning-gym:chain_sum", seed=3)
    with pytest.raises(ConfigError, match="refused its config"):  # the library's own validation
        agentrl.make("reasoning-gym:chain_sum", min_terms=5, max_terms=2)
    with pytest.raises(ConfigError, match=r"no dataset 'chainsum'\. Did you mean \['chain_sum'"):
        agentrl.make("reasoning-gym:chainsum")
    assert "seed" not in config_fields("chain_sum") and config_fields("chain_sum")["max_terms"] == 6


def test_train_and_test_draw_from_disjoint_library_seeds():
    train = agentrl.make("reasoning-gym:basic_arithmetic")
    test = agentrl.make("reasoning-gym:basic_arithmetic", split="test")
    assert (train.data.seed, test.data.seed) == (0, TEST_SEED) and train.size < TEST_SEED
    a, b = play(train, 7)[1], play(test, 7)[1]
    assert a["split"] == "train" and b["split"] == "test" and a["index"] == b["index"] == 7
    questions = {play(train, s)[0][-1].content for s in range(20)}
    assert not questions & {play(test, s)[0][-1].content for s in range(20)}
    # The same seed is the same task (the size wraps the index around).
    assert play(train, 7)[0] == play(train, 7 + train.size)[0]
    with pytest.raises(ConfigError, match="split"):
        ReasoningGymEnv("chain_sum", split="validation")


def test_the_python_tool_makes_it_a_tool_integrated_task():
    env = agentrl.make("reasoning-gym:chain_sum", python=True)
    assert env.needs_sandbox and "python" in env._system
    _obs, _, (ran, final) = play(env, 2, "```python\nprint(6 * 7)\n```", f"Answer: {0}")
    assert ran.tool_calls[0].status.value == "ok" and "42" in ran.observation[0].content
    assert final.terminated and final.reward == env.data.score_answer("0", env.entry)


@pytest.mark.slow  # a fresh interpreter imports agentrl and torch
def test_a_missing_library_is_one_error_naming_the_install_command():
    code = (
        "import sys\n"
        "sys.modules['reasoning_gym'] = None  # as if the extra were not installed\n"
        "import agentrl\n"
        "from agentrl.errors import ConfigError\n"
        "try:\n"
        "    agentrl.make('reasoning-gym:chain_sum')\n"
        "except ConfigError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pip install 'agentrl[reasoning-gym]'" in out.stdout
