"""Read recorded runs offline: load, filter, check for consistency, render to a terminal or one HTML page.

A run made by ``agentrl train`` records everything needed to replay it: the exact token stream of every
episode (ids, loss mask, sampler log-probs, provenance), the conversation, every tool call with its output,
the text of each model turn handed to ``Env.step``, the env id and seed, and the step's metrics and weights.
This package reads that record without any env, model or learner::

    from agentrl import replay

    run = replay.load("runs/math-tir-v0-20260101")          # a run dir or a trajectories.jsonl
    bad = replay.filter(run.trajectories, tool_status="error", max_reward=0)
    print(replay.render(bad[0], tokenizer=tok))
    replay.check(bad[0], tok)                # mask / log-prob / provenance / tool-record consistency
    replay.write_html(run, "run.html", tokenizer=tok)      # one self-contained page to browse the run

Everything that runs something again — re-executing tool calls in a fresh env, re-scoring, recomputing
log-probs with the weights that sampled them, reproducing a training step, and the run's tokenizer and
weights — needs envs, models and the learner, and lives one layer up in :mod:`agentrl.trainers.replay`.

Modules: :mod:`~agentrl.replay.decode` (token ids to text, model turns: the layer the others share),
:mod:`~agentrl.replay.records` (:func:`load`, :class:`Run`, :class:`Filter`),
:mod:`~agentrl.replay.consistency` (:func:`check`), :mod:`~agentrl.replay.terminal` (:func:`render`),
:mod:`~agentrl.replay.html` (:func:`write_html`) with :mod:`~agentrl.replay.page` (the viewer), and
:mod:`~agentrl.replay.reports` (the recompute reports the renderers show).
"""

from typing import TYPE_CHECKING

from agentrl.errors import SHIMS_REMOVED_IN, MovedError
from agentrl.replay.consistency import CheckReport, Finding, check
from agentrl.replay.decode import TokenText, actions_of, model_segments, token_text, turn_layout
from agentrl.replay.html import write_html
from agentrl.replay.records import Filter, Run, filter, load, select
from agentrl.replay.reports import RecomputeReport, TokenDiff, TrajectoryRecompute
from agentrl.replay.terminal import render

__all__ = [
    "CheckReport",
    "Filter",
    "Finding",
    "RecomputeReport",
    "Run",
    "TokenDiff",
    "TokenText",
    "TrajectoryRecompute",
    "actions_of",
    "check",
    "filter",
    "load",
    "model_segments",
    "render",
    "select",
    "token_text",
    "turn_layout",
    "write_html",
]

# Names the single-module agentrl.replay of releases before 2026-11-26 had, which run things again and moved
# up a layer. The core cannot import them back (trainers sit above it), so asking for one here names its
# new home instead of failing with a bare AttributeError/ImportError.
_MOVED_TO_TRAINERS = frozenset(
    {
        "CallReplay",
        "MetricCheck",
        "ReexecReport",
        "RescoreReport",
        "StepReplay",
        "StepReport",
        "areexec",
        "areexec_many",
        "arescore",
        "load_tokenizer_for",
        "load_weights",
        "recompute",
        "recompute_run",
        "reexec",
        "reproduce_step",
        "rescore",
        "step_advantages",
        "step_batch",
    }
)

if not TYPE_CHECKING:  # at run time only, so type checkers still flag every unknown name

    def __getattr__(name: str) -> None:
        if name in _MOVED_TO_TRAINERS:
            raise MovedError(
                f"agentrl.replay.{name} moved to agentrl.trainers.replay (replay that runs envs, models or "
                f"the learner lives with the trainers): from agentrl.trainers.replay import {name} (this "
                f"message goes in agentrl {SHIMS_REMOVED_IN})",
                name=name,
            )
        raise AttributeError(f"module 'agentrl.replay' has no attribute {name!r}", name=name)
