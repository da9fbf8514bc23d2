"""``textarena:<game>`` against the real textarena library: its rules, messages, invalid-move answers and
rewards; which games play offline; seeding that neither leaks into nor depends on the global random state."""

import asyncio
import contextlib
import random

import pytest

import agentrl
from agentrl import Action
from agentrl._sync import run_sync
from agentrl.envs.textarena_env import game_names, refusal
from agentrl.errors import ConfigError

textarena = pytest.importorskip("textarena", reason="the textarena extra (.ci/setup --dev installs it)")


def play(env, seed, *moves):
    async def go():
        obs, info = await env.reset(seed=seed)
        results = []
        for move in moves:
            results.append(await env.step(Action(text=move)))
            if results[-1].terminated:
                break
        return obs, info, results

    return asyncio.run(go())


def test_the_members_are_the_single_player_games_that_run_offline():
    names = game_names()
    assert {"TowerOfHanoi-v0", "GuessTheNumber-v0", "Minesweeper-v0", "Sudoku-v0", "Mastermind-v0"} <= set(
        names
    )
    assert not any(n.endswith(("-raw", "-train")) for n in names)
    assert agentrl.registry.family_names("textarena") == names
    assert refusal("Chess-v0") == "it is not a single-player game"
    assert "words" in refusal("Wordle-v0") and "network" in refusal("TwentyQuestions-v0")
    assert "does not parse" in refusal("Klondike-v0")  # textarena 0.7.4's module on Python 3.11


@pytest.mark.parametrize(
    ("game", "why"),
    [
        ("Wordle-v0", "NLTK's 'words' corpus"),
        ("GuessWho-v0", "OpenRouter"),
        ("Chess-v0", "not a single-player"),
    ],
)
def test_games_that_cannot_run_here_are_refused_with_the_reason(game, why):
    with pytest.raises(ConfigError, match=f"textarena:{game} cannot be played here: .*{why}"):
        agentrl.make(f"textarena:{game}")


def test_unknown_games_and_bad_arguments_are_clear_errors():
    with pytest.raises(ConfigError, match=r"no game 'tower'\. Did you mean \['TowerOfHanoi-v0'"):
        agentrl.make("textarena:tower")
    with pytest.raises(ConfigError, match="refused the arguments"):
        agentrl.make("textarena:TowerOfHanoi-v0", pegs=4)


SEED_BLIND = {"TowerOfHanoi-v0", "GuessTheNumber-v0", "Minesweeper-v0-small", "Mastermind-v0"}
"""Games whose first message is the same for every seed (one start position, or all of it hidden)."""


@pytest.mark.parametrize(
    "game",
    # The first two have a scripted win (sample_actions): check_env requires it to score above 0.
    ["TowerOfHanoi-v0", "GuessTheNumber-v0", "Minesweeper-v0-small", "Mastermind-v0", "Sudoku-v0-easy"],
)
def test_check_env(game):
    env = agentrl.make(f"textarena:{game}")
    blind = pytest.warns(UserWarning, match="six seeds") if game in SEED_BLIND else contextlib.nullcontext()
    with blind:
        agentrl.check_env(env)
    run_sync(env.close())


def test_textarenas_own_rules_messages_and_reward():
    env = agentrl.make("textarena:TowerOfHanoi-v0", num_disks=2, max_turns=10)
    obs, info, results = play(env, 1, "[A B]", "[A C]", "[B C]")
    assert "Tower of Hanoi with 2 disks" in obs[0].content and info["game"] == "TowerOfHanoi-v0"
    assert "You moved disk 1 from A to B" in results[0].observation[0].content
    assert "[A B]" not in results[0].observation[0].content  # the chat already holds the model's move
    last = results[-1]
    assert last.terminated and last.reward == 1.0 and not last.observation
    assert [r.reward for r in results[:-1]] == [0.0, 0.0]


def test_an_invalid_move_is_answered_as_textarena_answers_it():
    env = agentrl.make("textarena:TowerOfHanoi-v0")
    _, _, results = play(env, 1, "move A to C", "[C A]")
    first, second = results
    # textarena's error allowance: the first invalid move gets its warning and the game goes on ...
    assert "You attempted an invalid move" in first.observation[0].content and not first.terminated
    # ... a second invalid move in a row ends the game with textarena's reward (completion so far: 0).
    assert second.terminated and second.reward == 0.0 and second.info["invalid_move"] is True
    assert "empty tower" in second.info["reason"]


def test_a_seed_is_the_same_game_and_the_global_random_state_is_left_alone():
    env = agentrl.make("textarena:GuessTheNumber-v0")
    random.seed(123)
    before = random.random()
    random.seed(123)
    play(env, 5)
    target = env.game.state.game_state["game_number"]
    assert random.random() == before  # textarena seeded only the env's own copy of the global state
    numbers = set()
    for seed in range(12):
        play(env, seed)
        numbers.add(env.game.state.game_state["game_number"])
    assert len(numbers) > 1
    random.seed(999)  # whatever the process did to the global state in between
    play(env, 5)
    assert env.game.state.game_state["game_number"] == target


def test_what_a_game_prints_goes_to_stderr(capsys):
    env = agentrl.make("textarena:LogicPuzzle-v0")  # prints "Correct: 0, Total: ..." on an invalid move
    play(env, 1, "[zzz]")
    out, err = capsys.readouterr()
    assert out == "" and "Correct:" in err


def test_step_after_the_end_is_a_contract_error():
    env = agentrl.make("textarena:GuessTheNumber-v0")
    play(env, 3)
    number = env.game.state.game_state["game_number"]
    (result,) = play(env, 3, f"[{number}]")[2]
    assert result.terminated and result.reward == 1.0
    with pytest.raises(agentrl.errors.EnvContractError):
        asyncio.run(env.step(Action(text="[1]")))
