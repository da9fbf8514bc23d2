"""``textarena:<game>``: textarena's single-player games as multi-turn agentrl envs.

``agentrl.make("textarena:TowerOfHanoi-v0")`` plays the game of that textarena id (its variants too:
``textarena:Sudoku-v0-easy``) with textarena's own rules, prompts, board renderings, invalid-move answers and
rewards. The game is the raw textarena env, without textarena's wrappers: the chat history is the context,
so each turn shows only the game's *new* messages (textarena's ``LLMObservationWrapper`` would repeat the
whole history in every turn), and the model's move goes in as written (textarena's
``ActionFormattingWrapper`` would add the square brackets a move must have; here a move without them is
invalid, as textarena answers it). The reward is textarena's at the end of the game (0 before); an invalid
move is answered with textarena's own message, and the game ends as textarena ends it. The library is an
optional extra (``pip install 'agentrl[textarena]'``); ``agentrl envs textarena`` lists the games.

Which games: the registered ids whose game keeps a ``SinglePlayerState`` (read from the game's source, so
listing imports no game). A game that cannot run offline is refused with the reason: one that needs NLTK's
``words`` corpus (textarena downloads it at run time: Wordle, Hangman, WordLadder, WordSearch), one whose
answers come from an LLM over the network (GuessWho, TwentyQuestions), and one whose module does not parse
on this Python (Klondike and UltimateTexasHoldem in textarena 0.7.4).

Randomness: textarena draws from Python's global ``random`` (and some games from numpy's). Each env keeps
its own copy of that state and swaps it in only around textarena's calls, so a seed gives the same game,
episodes running side by side in one process do not disturb each other, and nothing else in the process sees
its global random state reseeded. There is no held-out split: the evaluation plays other seeds of the game.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import random
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from agentrl import Action, Env, Message, Observation, StepResult
from agentrl.errors import ConfigError, EnvContractError

INSTALL = "pip install 'agentrl[textarena]'"
PLAYER = 0
"""The one player's id in a textarena single-player game (its key in textarena's rewards)."""
NOTHING_NEW = "(no new message from the game; make your next move)"
"""Shown when a move left the game silent, so the chat never has two model turns in a row."""
_OFFLINE_UNSAFE = (
    ("nltk", "it needs NLTK's 'words' corpus, which textarena downloads at run time"),
    ("OpenRouter", "its answers come from an LLM over the network (OpenRouter)"),
)


def _library() -> Any:
    try:
        import textarena.envs.registration as registration
    except ImportError as e:
        raise ConfigError(f"the textarena envs need the textarena library: {INSTALL}") from e
    return registration


def _variants(registry: dict[str, Any]) -> list[str]:
    # textarena registers every game also as '<id>-raw' and '<id>-train' (other wrappers); this env never
    # uses textarena's wrappers, so those are the same game.
    return [i for i in registry if not i.endswith(("-raw", "-train"))]


def _source(entry_point: str) -> tuple[str, str]:
    # The file is found by its path: find_spec would import the game's package, and a package whose
    # module does not parse (or downloads data on import) must be refused without running it.
    module, _, _ = entry_point.partition(":")
    root = importlib.util.find_spec("textarena")
    top, *rest = module.split(".")
    if root is None or not root.submodule_search_locations or top != "textarena":
        raise ConfigError(f"textarena's game module {module!r} is not in the textarena package")
    path = Path(next(iter(root.submodule_search_locations)), *rest[:-1], rest[-1] + ".py")
    if not path.is_file():
        path = path.with_suffix("") / "__init__.py"
    if not path.is_file():
        raise ConfigError(f"textarena's game module {module!r} is missing from the installed wheel")
    return str(path), path.read_text(encoding="utf-8")


def refusal(game: str) -> str | None:
    """Why a registered textarena id cannot be played here, or ``None`` when it can."""
    registry = _library().ENV_REGISTRY
    if game not in registry:
        return "textarena registers no such game"
    entry_point = registry[game].entry_point
    return _module_refusal(entry_point) if isinstance(entry_point, str) else None


@functools.cache
def _module_refusal(entry_point: str) -> str | None:
    try:
        path, text = _source(entry_point)
    except ConfigError as e:
        return str(e)
    if "SinglePlayerState" not in text:
        return "it is not a single-player game"
    try:
        with warnings.catch_warnings():  # textarena's invalid escapes warn; only a SyntaxError matters here
            warnings.simplefilter("ignore")
            compile(text, path, "exec")
    except SyntaxError as e:
        return f"textarena's module does not parse on this Python ({e.msg}, line {e.lineno})"
    for marker, reason in _OFFLINE_UNSAFE:
        if marker in text:
            return reason
    return None


def game_names() -> list[str]:
    """The textarena ids playable here (single-player and offline), for ``agentrl envs textarena``."""
    registry = _library().ENV_REGISTRY
    return sorted(g for g in _variants(registry) if refusal(g) is None)


class TextArenaEnv(Env):
    """A single-player textarena game (``textarena:<id>``): textarena's rules, messages and reward.

    Args:
        game: The textarena id (``TowerOfHanoi-v0``, ``Sudoku-v0-easy``, ...).
        **game_kwargs: Override the arguments textarena registers the game with (``num_disks=4``).
    """

    def __init__(self, game: str, **game_kwargs: Any):
        registration = _library()
        registry = registration.ENV_REGISTRY
        if game not in registry:
            playable = game_names()
            close = [g for g in playable if g.lower().startswith(game.lower().split("-v")[0])]
            hint = f"Did you mean {close}?" if close else f"Playable here: {playable}"
            raise ConfigError(f"textarena has no game {game!r}. {hint}")
        why = refusal(game)
        if why is not None:
            raise ConfigError(f"textarena:{game} cannot be played here: {why}")
        spec = registry[game]
        entry_point = spec.entry_point
        if isinstance(entry_point, str):
            module, _, name = entry_point.partition(":")
            entry_point = getattr(importlib.import_module(module), name)
        try:
            self.game = entry_point(**{**spec.kwargs, **game_kwargs})
        except TypeError as e:
            raise ConfigError(f"textarena:{game} refused the arguments {sorted(game_kwargs)}: {e}") from e
        self.game_id = game
        self.done = True
        self._state = _RandomState(0)

    @contextlib.contextmanager
    def _textarena(self) -> Iterator[None]:
        """Run textarena's code with this env's own global random state (module docstring), its prints on
        stderr."""
        outside = _RandomState.capture()
        self._state.restore()
        try:
            # Some games print progress to stdout ("Generated puzzle in 1 attempts"): it goes to stderr, so
            # stdout stays the command's own (agentrl eval --json).
            with contextlib.redirect_stdout(sys.stderr):
                yield
        finally:
            self._state = _RandomState.capture()
            outside.restore()

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start the game for ``seed`` (textarena seeds its own draws with it)."""
        self.seed(seed)
        game_seed = seed if seed is not None else self.rng.randrange(2**31)
        with self._textarena():
            _seed_numpy(game_seed)  # a game that draws from numpy without a seed of its own
            self.game.reset(num_players=1, seed=game_seed)
            observation = self._observation()
        import textarena

        if not isinstance(self.game.state, textarena.SinglePlayerState):
            raise ConfigError(f"textarena:{self.game_id} is not a single-player game")
        self.done, self.moves = False, 0
        return (Message("user", observation),), {"game": self.game_id, "game_seed": game_seed}

    async def step(self, action: Action) -> StepResult:
        """Play the model's turn as a move; textarena answers it (an invalid move included)."""
        if self.done:
            raise EnvContractError(f"textarena:{self.game_id}: step() before reset() or after the game ended")
        self.moves += 1
        with self._textarena():
            done, step_info = self.game.step(action.text)
            observation = self._observation()
            if done:
                rewards, game_info = self.game.close()
        info: dict[str, Any] = {"moves": self.moves, **_plain(step_info)}
        if not done:
            return StepResult((Message("user", observation or NOTHING_NEW),), info=info)
        self.done = True
        reward = float((rewards or {}).get(PLAYER, 0.0))
        outcome = _plain(game_info.get(PLAYER, {})) if isinstance(game_info, dict) else {}
        return StepResult(reward=reward, terminated=True, info={**info, **outcome})

    def _observation(self) -> str:
        _, messages = self.game.get_observation()
        # The player's own move comes back as an observation (some games send it as the player's, some as
        # the game's); the chat already holds it as the model's turn. A single player sends no other moves.
        import textarena

        move = textarena.ObservationType.PLAYER_ACTION
        return "\n".join(str(text) for _, text, kind in messages if kind != move).strip()

    def sample_actions(self) -> tuple[str, ...]:
        """A winning game where its solution can be read from textarena's state: Tower of Hanoi (the
        classic recursion) and Guess the Number (the hidden number); none for the other games."""
        if self.done:
            return ()
        game_state = self.game.state.game_state
        if "towers" in game_state:
            moves: list[str] = []
            _hanoi(len(game_state["towers"]["A"]), "A", "C", "B", moves)
            return tuple(moves)
        if "game_number" in game_state:
            return (f"[{game_state['game_number']}]",)
        return ()

    async def close(self) -> None:
        """Nothing to release (textarena's games are plain objects); the episode ends."""
        self.done = True


def _hanoi(n: int, source: str, target: str, spare: str, out: list[str]) -> None:
    if n == 0:
        return
    _hanoi(n - 1, source, spare, target, out)
    out.append(f"[{source} {target}]")
    _hanoi(n - 1, spare, target, source, out)


def _seed_numpy(seed: int) -> None:
    np.random.seed(seed % 2**32)


def _plain(info: Any) -> dict[str, Any]:
    """The info dict of textarena with JSON-friendly values (its reasons are strings, its flags bools)."""
    if not isinstance(info, dict):
        return {}
    return {
        str(k): v if isinstance(v, str | int | float | bool) or v is None else str(v) for k, v in info.items()
    }


class _RandomState:
    """Python's and numpy's global random states, captured and restored together."""

    def __init__(self, seed: int | None = None, *, python: Any = None, numpy: Any = None):
        if seed is not None:
            python = random.Random(seed).getstate()
            numpy = np.random.RandomState(seed).get_state()
        self.python, self.numpy = python, numpy

    @classmethod
    def capture(cls) -> _RandomState:
        return cls(python=random.getstate(), numpy=np.random.get_state())

    def restore(self) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
