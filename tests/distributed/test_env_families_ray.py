"""`agentrl train --ray` on the library env families (reasoning-gym, textarena, BFCL multi-turn), on the
tests' small Ray cluster with the tiny model (real HF inference servers, a real learner, one step).

The rollout workers are Ray worker processes that imported none of the three libraries: each builds the
run's env from the id and ``--env-kwargs`` the run records, through ``agentrl.make`` (which finds the
families through the ``agentrl.envs`` plug-in entry point). The test checks that every episode ran on a
worker and that its prompt is the one the same env, built here, shows for the same seed, so a worker that
built another env or dropped the kwargs fails it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import agentrl
from agentrl import read_trajectories
from agentrl.metrics import read_metrics
from agentrl.models import resolve_tokenizer
from agentrl.trainers.cli import main

ray = pytest.importorskip("ray", reason="the Ray tests need the ray extra (bash .ci/setup --dev)")

pytestmark = pytest.mark.slow

FAMILIES = [
    # max_terms 2: a question whose numbers differ from seed to seed (the prompt check below bites).
    pytest.param("reasoning-gym:chain_sum", {"max_terms": 2}, "reasoning_gym", id="reasoning-gym"),
    pytest.param("textarena:GuessTheNumber-v0", {}, "textarena", id="textarena"),
    pytest.param("bfcl-multi-turn-v0", {"category": "miss_func"}, "bfcl_eval", id="bfcl"),
]


def first_message(env_id: str, kwargs: dict[str, Any], seed: int) -> str:
    """The last first-turn message (the task) of ``env_id`` built here, for ``seed``."""

    async def reset() -> str:
        async with agentrl.make(env_id, **kwargs) as env:
            observation, _ = await env.reset(seed=seed)
            return observation[-1].content

    return asyncio.run(reset())


@pytest.mark.parametrize(("env", "kwargs", "library"), FAMILIES)
def test_train_on_ray_builds_the_family_env_on_the_workers(cluster, tmp_path, capsys, env, kwargs, library):
    pytest.importorskip(library, reason="the env family's extra (.ci/setup --dev installs it)")
    run = tmp_path / "run"
    argv = [
        *("train", "--model", "tiny", "--env", env, "--env-kwargs", json.dumps(kwargs), "--ray", "auto"),
        *("--group-size", "2", "--groups-per-step", "2", "--steps", "1", "--no-progress"),
        *("--eval.tasks", "1", "--eval.samples", "1", "--out", str(run)),
        # BFCL's prompts hold every function doc of the task (2,500-5,400 tokens): room for them.
        *("--rollout.max-new-tokens", "8", "--rollout.max-turns", "2", "--rollout.max-total-tokens", "8192"),
    ]
    assert main(argv) == 0, capsys.readouterr().err
    config = json.loads((run / "config.json").read_text())
    assert config["env"] == env and config["env_kwargs"] == kwargs and config["deploy"]["ray"] == "auto"
    [row] = read_metrics(run)
    assert row["step"] == 0 and row["episodes/total"] == 4 and row["episodes/infra_failures"] == 0
    trajectories = list(read_trajectories(run))
    assert len(trajectories) == 4
    tok = resolve_tokenizer("tiny")
    for t in trajectories:
        assert t.meta.env_id == env and t.meta.step == 0
        assert t.meta.provenance is not None and t.meta.provenance.worker.startswith("worker-")
        assert t.meta.seed is not None
        task = first_message(env, kwargs, t.meta.seed).strip()
        assert task and task in tok.decode(t.token_ids), (env, t.meta.seed)
    # The held-out evaluation ran on Ray too, before and after the step.
    for label in ("untrained", "trained"):
        report = json.loads((run / f"eval-{label}.json").read_text())["report"]
        assert report["env"] == env and report["episodes"] == 1
