"""The rollout worker and the inference server render with the tokenizer the driver handed them (one
object put in the object store, :func:`~agentrl.trainers.ray.actors.handed_tokenizer`), not one they loaded:
the worker's renderer, ``resolve_tokenizer(cfg.model)`` (env factories) and a policy factory's all get it."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from agentrl.models import resolve_tokenizer
from agentrl.trainers.ray.actors import InferenceServer, RolloutWorker, handed_tokenizer
from agentrl.trainers.train_config import TrainConfig

from .scripted import ScriptedTIRFactory

ray = pytest.importorskip("ray", reason="the Ray runtime's tests need the ray extra (bash .ci/setup --dev)")

pytestmark = pytest.mark.slow

# _probe runs in the actors, where this module's name (``distributed...`` under pytest) is not importable.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _probe(actor: Any) -> dict[str, Any]:
    """Inside the actor: which tokenizer each part uses, and what it renders."""
    from agentrl import models

    handed = models._HANDED.get("tiny")
    used = actor.renderer.tokenizer if hasattr(actor, "renderer") else actor.policy.tokenizer
    return {
        "handed": handed is not None,
        "used_is_handed": used is handed,
        "resolves_to_handed": models.resolve_tokenizer("tiny") is handed,
        "backend": used.backend_tokenizer.to_str(),
        "chat": used.apply_chat_template([{"role": "user", "content": "2+2? 数学"}], tokenize=False),
    }


def test_workers_and_servers_use_the_drivers_tokenizer(cluster: Any) -> None:
    cfg = TrainConfig(model="tiny", env="math-tir-arith-v0")
    ref = handed_tokenizer(ray, cfg.model)
    assert ref is not None
    tok = resolve_tokenizer("tiny")
    worker = (
        ray.remote(RolloutWorker)
        .options(num_cpus=0, resources={"rollout": 1, "sandbox": 1})
        .remote("worker-0", cfg, [], None, tokenizer=ref)
    )
    server = (
        ray.remote(InferenceServer)
        .options(num_cpus=0, resources={"inference": 1})
        .remote("server-0", ScriptedTIRFactory(), cfg, None, None, ref)
    )
    try:
        probes = ray.get([a.__ray_call__.remote(_probe) for a in (worker, server)], timeout=120)
    finally:
        for a in (worker, server):
            ray.kill(a, no_restart=True)
    chat = tok.apply_chat_template([{"role": "user", "content": "2+2? 数学"}], tokenize=False)
    for p in probes:
        assert p["handed"] and p["used_is_handed"] and p["resolves_to_handed"], p
        assert p["backend"] == tok.backend_tokenizer.to_str() and p["chat"] == chat
