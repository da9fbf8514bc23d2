"""Versioned adapter sync: after every sync, which adapter does each sampler actually serve?

A LoRA learner hands its samplers the adapter alone (:func:`agentrl.lora.published_state`). A sync that
reports success but leaves the sampler on the old adapter is the quiet failure of verl #7495: the sampler
kept sampling the initial policy, and it looked like staleness (KL climbing, effective sample size
collapsing). So after each sync the sampler's adapter is hashed where it generates from (the model object
the policy runs, not the message it was sent) and compared with the learner's: a mismatch raises
:class:`~agentrl.errors.PolicyError` (an infrastructure failure, never data), and each sync is recorded as
one :class:`AdapterSync` line in ``<run>/adapter_sync.jsonl``.

A vLLM sampler (:mod:`agentrl.policies.vllm_lora`) holds its adapters in vLLM's workers, not in a model
object here: it answers ``served_adapter()`` with the version it serves and the digest of the adapter its
workers report, which :func:`verify_served` compares in the same way.

The Ray runtime does the same check per inference server through the checksum each server reports of the
tensors it holds (``trainers/ray``), which with LoRA are the adapter's.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass
from typing import Any

from agentrl.errors import PolicyError
from agentrl.lora import adapter_digest, adapter_state
from agentrl.run import ADAPTER_SYNC_FILE, RunDir

__all__ = [
    "SYNC_FILE",
    "AdapterSync",
    "adapter_params",
    "check_served",
    "read_syncs",
    "served_digest",
    "verify_served",
]

SYNC_FILE = ADAPTER_SYNC_FILE
"""One :class:`AdapterSync` per line, in the run directory (:attr:`RunDir.adapter_sync_path` names it)."""


@dataclass(frozen=True, slots=True)
class AdapterSync:
    """One sampler's adapter after one sync."""

    version: int
    """The weights version the sampler says it serves."""
    sampler: str
    """Which sampler (``local``, ``server-0``, ...)."""
    sha256: str
    """:func:`agentrl.lora.adapter_digest` of the adapter the sampler generates with."""
    learner_sha256: str
    """The same digest of the learner's adapter at publish time (equal, or the sync failed)."""
    adapter_bytes: int
    """Bytes of the adapter's tensors (what one sync moves)."""


def adapter_params(model: Any) -> str:
    """``"73,728 adapter parameters (0.05 % of 134,589,312)"``: what the optimizer holds, for the log."""
    state = adapter_state(model) or {}
    n = sum(t.numel() for t in state.values())
    total = sum(p.numel() for p in model.parameters())
    return f"{n:,} adapter parameters ({100 * n / max(total, 1):.2f} % of {total:,})"


def served_digest(policy: Any) -> str:
    """The digest of the adapter ``policy`` generates with (its ``model``'s own LoRA tensors).

    Raises:
        PolicyError: the policy exposes no model, or its model has no adapter (the adapter never arrived).
    """
    model = getattr(policy, "model", None)
    if model is None or not hasattr(model, "state_dict"):
        raise PolicyError(
            f"{type(policy).__name__} does not expose the model it samples with, so the adapter it serves "
            "cannot be checked (a sampler that keeps its adapter elsewhere, as vLLM does, reports it through "
            "served_adapter(), which verify_served asks)"
        )
    if adapter_state(model) is None:
        raise PolicyError(f"{type(policy).__name__} samples with a model that has no LoRA adapter")
    return adapter_digest(model)


def check_served(
    run: RunDir, policy: Any, learner_model: Any, version: int, sampler: str = "local"
) -> AdapterSync:
    """Check that ``policy`` serves the learner's adapter as ``version`` and record it in ``<run>/``
    :data:`SYNC_FILE`.

    Raises:
        PolicyError: the sampler reports another version, or serves another adapter than the learner's.
    """
    got = served_digest(policy)
    return _record(run, learner_model, got, int(getattr(policy, "version", -1)), version, sampler)


async def verify_served(
    run: RunDir, policy: Any, learner_model: Any, version: int, sampler: str = "local"
) -> AdapterSync:
    """:func:`check_served` for any sampler: one that reports its adapter itself (``served_adapter()``, the
    vLLM samplers, whose adapters live in vLLM's workers) is asked; the others are hashed in a thread.

    Raises:
        PolicyError: as :func:`check_served`.
    """
    report = getattr(policy, "served_adapter", None)
    if report is None:
        return await asyncio.to_thread(check_served, run, policy, learner_model, version, sampler)
    served = await report()
    return _record(run, learner_model, str(served.sha256), int(served.version), version, sampler)


def _record(
    run: RunDir, learner_model: Any, got: str, served_version: int, version: int, sampler: str
) -> AdapterSync:
    learner = adapter_state(learner_model)
    if learner is None:
        raise PolicyError("check_served: the learner's model has no LoRA adapter")
    want = adapter_digest(learner)
    if served_version != version or got != want:
        raise PolicyError(
            f"adapter sync to version {version} failed: the sampler serves version {served_version} with "
            f"adapter sha256:{got[:16]}, the learner's is sha256:{want[:16]} (a sampler that never receives "
            "the adapter keeps sampling an old policy)"
        )
    size = sum(t.numel() * t.element_size() for t in learner.values())
    record = AdapterSync(version, sampler, got, want, size)
    with open(run.adapter_sync_path, "a") as fh:
        fh.write(json.dumps(asdict(record)) + "\n")
    return record


def read_syncs(run: RunDir) -> list[AdapterSync]:
    """The run's :class:`AdapterSync` records, in order (empty when it has none)."""
    path = run.adapter_sync_path
    if not path.is_file():
        return []
    return [AdapterSync(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
