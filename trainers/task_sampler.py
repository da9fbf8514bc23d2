"""Which task each draw of a training step runs: the seed order, refills, and the difficulty curriculum.

A task is an env seed; its id is ``"{env}:{seed}"`` (one env per run). Draw ``d`` of step ``k``:

* ``--curriculum none``: a *fresh* task, a pure function of (``--seed``, k, d):
  draws ``0 .. groups-per-step − 1`` are :func:`~agentrl.trainers.factories.task_seeds` (the order runs
  always had), refills (``d ≥ groups-per-step``, dynamic sampling) are :func:`refill_seed`, from a range no
  step's first draws use, so a refill is never a task another step trains as fresh.
* ``--curriculum difficulty``: the draw picks a *pool* at random (its own stream, seeded by
  (--seed, k, d)), weighted by :data:`POOL_WEIGHTS` over the pools that are not empty, then a task in it:

  - ``new``: the fresh task above (always available);
  - ``medium``: tasks whose recent group mean reward is strictly between 0 and 1 (they had signal);
  - ``solved`` (recent mean ≥ 1) and ``unsolved`` (≤ 0): drawn less often, never never.

  "Recent" is the mean over a task's last :data:`WINDOW` group means. A task is drawn at most once per step.

The difficulty of tasks comes from :meth:`TaskSampler.observe`, called when a step trains, with every group
of that step that finished (filtered ones too: an all-solved group says the task is solved). Step ``k``'s
draws see the observations of steps ``≤ k − S − 1`` only (``S`` = ``--max-staleness``; 0 for the
synchronous loop), the steps that are certainly trained when the first group of step ``k`` may start; so
step ``k``'s tasks are a function of the seed and of the observations, however the asynchronous loop's
groups interleave. The observations are the sampler's state (:meth:`TaskSampler.state`), saved beside every
checkpoint (:func:`save_sampler_state`) and loaded on resume, so a resumed run draws what the uninterrupted
run would have.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentrl.errors import ConfigError, StoreError
from agentrl.groups import TrajectoryGroup
from agentrl.run import RunDir

__all__ = [
    "POOL_WEIGHTS",
    "WINDOW",
    "Curriculum",
    "TaskSampler",
    "load_sampler_state",
    "refill_seed",
    "sampler_state_path",
    "save_sampler_state",
    "task_sampler",
]

Curriculum = Literal["none", "difficulty"]

WINDOW = 4
"""Group means per task that make its recent mean reward."""
POOL_WEIGHTS: dict[str, float] = {"medium": 0.5, "new": 0.3, "solved": 0.1, "unsolved": 0.1}
"""Relative chance of each pool (renormalised over the pools a draw can use)."""
SOLVED, UNSOLVED = 1.0, 0.0
"""Recent mean reward at or above / at or below which a task counts as always / never solved (agentrl's
envs score 1 for a pass and 0 for a fail)."""
REFILL_BASE = 500_000
"""Refill seeds start this far into a run seed's range (``seed × 1 000 003``); first draws use
``step × groups-per-step`` below it, so the two never meet before step 500 000 / groups-per-step."""


def refill_seed(seed: int, step: int, draw: int, groups_per_step: int, max_draws: int) -> int:
    """The fresh task of refill draw ``draw`` (≥ ``groups_per_step``) of ``step``: a pure function."""
    if not groups_per_step <= draw < max_draws:
        raise ConfigError(f"refill draw {draw} outside {groups_per_step} .. {max_draws - 1}")
    per_step = max_draws - groups_per_step
    return seed * 1_000_003 + REFILL_BASE + step * per_step + (draw - groups_per_step)


def _fresh(seed: int, step: int, draw: int, groups_per_step: int, max_draws: int) -> int:
    if draw < groups_per_step:
        return seed * 1_000_003 + step * groups_per_step + draw  # = task_seeds(seed, step, B)[draw]
    return refill_seed(seed, step, draw, groups_per_step, max_draws)


@dataclass
class TaskSampler:
    """The task of every draw of a run (see the module docstring); one instance per run."""

    seed: int
    """The run's ``--seed``."""
    groups_per_step: int
    """``--groups-per-step``: draws ``0 .. groups_per_step − 1`` of a step are its first ones."""
    max_draws: int
    """Most draws a step may make (``groups_per_step`` without dynamic sampling)."""
    curriculum: Curriculum = "none"
    """``--curriculum``."""
    lag: int = 0
    """``--max-staleness``: step k's draws see the observations of steps ≤ k − lag − 1."""
    history: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Task seed → its observed ``(step, group mean reward)``, oldest first (the saved state)."""
    _drawn: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.curriculum not in ("none", "difficulty"):
            raise ConfigError(f"--curriculum must be none or difficulty, got {self.curriculum!r}")
        if self.max_draws < self.groups_per_step:
            raise ConfigError(f"max_draws {self.max_draws} < groups_per_step {self.groups_per_step}")

    # -- drawing ------------------------------------------------------------------------------------
    def task(self, step: int, draw: int) -> int:
        """The task seed of draw ``draw`` of ``step``. Draws of a step are made in order (0, 1, ...): asking
        for a later one first is an error; asking again for an earlier one returns the same task."""
        drawn = self._drawn.setdefault(step, [])
        if draw < len(drawn):
            return drawn[draw]
        if draw != len(drawn):
            raise ConfigError(f"step {step}: draw {draw} asked before draw {len(drawn)}")
        if not 0 <= draw < self.max_draws:
            raise ConfigError(f"step {step}: draw {draw} outside 0 .. {self.max_draws - 1}")
        fresh = _fresh(self.seed, step, draw, self.groups_per_step, self.max_draws)
        seed = fresh if self.curriculum == "none" else self._pick(step, draw, fresh, set(drawn))
        drawn.append(seed)
        return seed

    def tasks(self, step: int, draws: range) -> list[int]:
        """:meth:`task` of each of ``draws`` (in order)."""
        return [self.task(step, d) for d in draws]

    def pools(self, step: int) -> dict[str, list[int]]:
        """The known tasks by difficulty as step ``step``'s draws see them (sorted seeds; ``new`` is not
        listed: it is the fresh task of each draw)."""
        cutoff = step - self.lag - 1
        out: dict[str, list[int]] = {"medium": [], "solved": [], "unsolved": []}
        for task in sorted(self.history):
            seen = [r for s, r in self.history[task] if s <= cutoff][-WINDOW:]
            if not seen:
                continue
            mean = sum(seen) / len(seen)
            pool = "solved" if mean >= SOLVED else "unsolved" if mean <= UNSOLVED else "medium"
            out[pool].append(task)
        return out

    def _pick(self, step: int, draw: int, fresh: int, taken: set[int]) -> int:
        rng = random.Random(f"agentrl-curriculum:{self.seed}:{step}:{draw}")
        pools = {name: [t for t in ts if t not in taken] for name, ts in self.pools(step).items()}
        names = ["new", *(n for n in ("medium", "solved", "unsolved") if pools[n])]
        weights = [POOL_WEIGHTS[n] for n in names]
        name = rng.choices(names, weights=weights)[0]
        return fresh if name == "new" else rng.choice(pools[name])

    # -- observing ----------------------------------------------------------------------------------
    def observe(self, step: int, groups: list[TrajectoryGroup]) -> None:
        """Step ``step`` trained: record each finished group's mean reward over its usable members (a group
        of infrastructure failures only tells nothing) and forget the step's draws."""
        self._drawn.pop(step, None)
        for g in groups:
            usable = g.usable()
            if usable is None or g[0].meta.seed is None:
                continue
            rewards = usable.rewards
            hist = self.history.setdefault(int(g[0].meta.seed), [])
            hist.append((step, sum(rewards) / len(rewards)))
            # Keep what the lagged views of the steps still to draw can use: WINDOW plus lag + 1 newer.
            del hist[: max(0, len(hist) - (WINDOW + self.lag + 1))]

    def forget_draws(self) -> None:
        """Drop the draws made so far (a resumed run redraws its steps from their first draw)."""
        self._drawn.clear()

    # -- state --------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The JSON state that makes future draws exact (the observations)."""
        return {
            "version": 1,
            "curriculum": self.curriculum,
            "history": {str(t): [[s, r] for s, r in h] for t, h in sorted(self.history.items())},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state`; the draws made so far are forgotten."""
        try:
            if state.get("version") != 1:
                raise ValueError(f"unknown version {state.get('version')!r}")
            history = {int(t): [(int(s), float(r)) for s, r in h] for t, h in dict(state["history"]).items()}
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise StoreError(f"not a task sampler state: {e}") from e
        self.history = history
        self._drawn.clear()


def task_sampler(cfg: Any) -> TaskSampler:
    """The sampler of a run with these settings (a :class:`~agentrl.trainers.train_config.TrainConfig`; not
    imported, which would be a cycle), its state empty: a resume loads it."""
    b = cfg.batch
    draws = b.dynamic_sampling.max_draws if b.dynamic_sampling.enabled else 1
    return TaskSampler(
        cfg.seed, b.groups_per_step, draws * b.groups_per_step, b.curriculum, cfg.async_.max_staleness
    )


def sampler_state_path(run: RunDir, step: int) -> Path:
    """``<run>/task_sampler/step-NNNNNN.json``: the sampler's state after ``step`` trained steps."""
    return run.task_sampler_path(step)


def save_sampler_state(run: RunDir, step: int, sampler: TaskSampler) -> None:
    """Write the sampler's state after ``step`` steps, atomically. Called before the checkpoint of ``step``
    is written, so every checkpoint on disk has its state; states of steps with no checkpoint left are
    removed. Without a curriculum the draws depend on no state, and nothing is written."""
    if sampler.curriculum == "none":
        return
    path = sampler_state_path(run, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(sampler.state(), separators=(",", ":")))
    os.replace(tmp, path)
    kept = {c.step for c in run.checkpoints(complete=False)} | {step}
    for old in path.parent.glob("step-*.json"):
        name = old.name.removesuffix(".json")
        if name.startswith("step-") and name[5:].isdigit() and int(name[5:]) not in kept:
            old.unlink(missing_ok=True)


def load_sampler_state(run: RunDir, step: int, sampler: TaskSampler) -> None:
    """Load the state saved with the checkpoint of ``step`` (step 0: the empty state). A curriculum run
    whose state is missing cannot resume exactly: an error says so."""
    if step == 0:
        return
    path = sampler_state_path(run, step)
    if not path.is_file():
        if sampler.curriculum == "none":
            return  # its draws do not depend on any state
        raise StoreError(
            f"{path} is missing: the curriculum's state of the checkpoint of step {step} was not saved, so "
            "the resumed run could not draw the tasks the uninterrupted run would have"
        )
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise StoreError(f"{path}: cannot read the task sampler's state: {e}") from e
    sampler.load_state(state)
