"""LoRA on vLLM: one adapter per live policy version, loaded through vLLM's own LoRA path, for both transports
(the in-process engine's ``add_lora``/``remove_lora``, and ``vllm serve``'s ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``).

A LoRA learner publishes the adapter's tensors alone (:func:`agentrl.lora.published_state`). Each version is
written as a peft adapter folder and loaded under its own name (``agentrl-v7``), so a turn that started on
version 7 finishes on version 7 while version 8 serves new turns, as TRL's async GRPO does. At most
``max_live`` versions are loaded at once (``--max-staleness`` + 1: a turn older than that would be dropped
anyway); before a new version loads, the oldest goes, after its turns in flight have finished.

After each load every vLLM worker reports :func:`agentrl.policies.vllm_worker.checksum` of the adapter tensors
it registered, in vLLM's own form (:func:`~agentrl.policies.vllm_worker.lora_engine_form`: the fused
q/k/v and gate/up modules unpacked, ``lora_B`` pre-scaled by alpha / rank as vLLM does), and it must equal the
same digest of the learner's tensors; otherwise the load is a :class:`~agentrl.errors.PolicyError` (verl
#7495: a sampler that never received the adapter kept sampling the initial policy).
:meth:`LiveAdapters.served` asks the workers again at any time and answers with the version served and the
learner-side :func:`agentrl.lora.adapter_digest` of the adapter they hold
(:func:`agentrl.lora_sync.verify_served` compares it with the learner's and records it).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agentrl.errors import ConfigError, PolicyError
from agentrl.policies.vllm_worker import checksum, lora_engine_form
from agentrl.protocols import WeightUpdate

__all__ = [
    "VLLM_MAX_LORA_RANKS",
    "AdapterControl",
    "AdapterPush",
    "LiveAdapter",
    "LiveAdapters",
    "ServedAdapter",
    "engine_lora_kwargs",
    "write_adapter",
]

CHECKSUMS_METHOD = "agentrl_lora_checksums"
"""The worker extension's method that reports ``{lora id: checksum}`` (in :mod:`.vllm_worker`)."""
REMOVE_METHOD = "agentrl_remove_lora"
"""The worker extension's method that drops one adapter from a worker's LoRA cache."""
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM 0.32 accepts for ``max_lora_rank`` (an adapter's rank may be anything up to it)."""


def engine_lora_kwargs(rank: int, max_live: int) -> dict[str, Any]:
    """The engine settings for adapters of rank ``rank``, ``max_live`` of them loaded at once
    (``--enable-lora --max-loras N --max-lora-rank R`` on ``vllm serve``)."""
    if rank < 1 or max_live < 1:
        raise ConfigError(f"a vLLM LoRA engine needs rank >= 1 and max_live >= 1, got {rank}, {max_live}")
    fits = [r for r in VLLM_MAX_LORA_RANKS if r >= rank]
    if not fits:
        raise ConfigError(f"vLLM serves LoRA ranks up to {VLLM_MAX_LORA_RANKS[-1]}, got --lora.rank {rank}")
    return {"enable_lora": True, "max_loras": max_live, "max_lora_rank": fits[0], "max_cpu_loras": max_live}


class AdapterControl(Protocol):
    """The engine calls the adapter versions need; one implementation per transport."""

    async def add_adapter(self, name: str, lora_id: int, path: str) -> None:
        """Load the peft adapter folder ``path`` as ``name`` (``lora_id`` where the caller picks ids)."""
        ...

    async def remove_adapter(self, name: str, lora_id: int) -> None:
        """Unload adapter ``name`` (vLLM's id ``lora_id``) from the engine and its workers."""
        ...

    async def collective_rpc(self, method: str, *args: str) -> list[Any]:
        """Call ``method`` of the worker extension on every worker; one result per worker."""
        ...


@dataclass(frozen=True, slots=True)
class AdapterPush:
    """What loading one adapter version did, for logs, ``adapter_sync.jsonl`` and benchmarks."""

    version: int
    """The policy version the adapter belongs to."""
    name: str
    """The name it is served under (``agentrl-v7``; the ``model`` of a completions request)."""
    lora_id: int
    """vLLM's integer id of the adapter."""
    sha256: str
    """:func:`agentrl.lora.adapter_digest` of the learner's adapter tensors."""
    engine_sha256: str
    """The digest every vLLM worker reported for the adapter it registered (vLLM's form of the tensors)."""
    bytes: int
    """Size of the adapter file written (what one sync moves)."""
    write_s: float
    """Seconds to checksum and write the adapter folder."""
    load_s: float
    """Seconds from the first unload to the workers' checksums: the engine side of the sync."""
    unloaded: tuple[int, ...]
    """Versions unloaded to make room (the oldest first)."""


@dataclass(frozen=True, slots=True)
class ServedAdapter:
    """What a vLLM LoRA sampler serves now, as its workers report it."""

    version: int
    """The version new turns sample with."""
    sha256: str
    """:func:`agentrl.lora.adapter_digest` of the adapter the workers hold for it (``engine:<digest>`` when
    they hold one that matches no pushed adapter, ``missing`` when they hold none under its id)."""
    live: tuple[int, ...]
    """Every version loaded now (turns in flight may still use the older ones)."""


@dataclass(slots=True)
class LiveAdapter:
    """One loaded adapter version (mutable: it counts the turns using it)."""

    push: AdapterPush
    folder: Path
    users: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)


def write_adapter(named_tensors: Mapping[str, Any], *, alpha: float, folder: Path) -> int:
    """Write the learner's adapter tensors as a peft adapter folder vLLM loads; return the bytes written.

    Names go from the learner's ``model.layers.0.self_attn.q_proj.lora_A.default.weight`` to peft's saved
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``; the rank is read from the tensors and
    ``target_modules`` lists the module names that have adapters.

    Raises:
        ConfigError: there are no LoRA tensors, or their ranks differ.
    """
    from safetensors.torch import save_file

    out: dict[str, Any] = {}
    targets: set[str] = set()
    ranks: set[int] = set()
    for name, t in named_tensors.items():
        for part in (".lora_A.", ".lora_B."):
            if part in name:
                module = name.split(part)[0]
                targets.add(module.rsplit(".", 1)[-1])
                x = t.detach().to("cpu").contiguous()
                ranks.add(int(x.shape[0] if part == ".lora_A." else x.shape[1]))
                out[f"base_model.model.{module}{part}weight"] = x
    if not out:
        raise ConfigError("write_adapter: no LoRA tensors (names with .lora_A./.lora_B.) to write")
    if len(ranks) != 1:
        raise ConfigError(f"write_adapter: the adapter's tensors have different ranks {sorted(ranks)}")
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": ranks.pop(),
        "lora_alpha": float(alpha),
        "lora_dropout": 0.0,
        "target_modules": sorted(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "base_model_name_or_path": None,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))
    save_file(out, str(folder / "adapter_model.safetensors"))
    for p in (folder, folder / "adapter_config.json", folder / "adapter_model.safetensors"):
        p.chmod(0o755 if p.is_dir() else 0o644)  # a server running as another user only reads them
    return sum(p.stat().st_size for p in folder.iterdir())


def engine_digest(named_tensors: Mapping[str, Any], *, alpha: float, dtype: Any) -> str:
    """The checksum a vLLM worker reports for these adapter tensors once registered in ``dtype``."""
    ranks = {int(t.shape[0]) for n, t in named_tensors.items() if ".lora_A." in n}
    if len(ranks) != 1:
        raise ConfigError(f"engine_digest: expected one LoRA rank, got {sorted(ranks)}")
    return checksum(lora_engine_form(named_tensors.items(), float(alpha) / ranks.pop(), dtype).items())


class LiveAdapters:
    """The adapter versions loaded in one vLLM engine.

    Args:
        control: The engine's adapter calls (:class:`AdapterControl`).
        max_live: How many versions may be loaded at once (``--max-staleness`` + 1; the engine's
            ``max_loras``).
        alpha: The adapters' ``lora_alpha`` (the learner's ``--lora.alpha``).
        dtype: The dtype vLLM keeps adapters in (the engine's model dtype), for :func:`engine_digest`.
        weights_dir: Where adapter folders are written (both sides read it).
    """

    def __init__(
        self, control: AdapterControl, *, max_live: int, alpha: float, dtype: Any, weights_dir: Path
    ):
        if max_live < 1:
            raise ConfigError(f"max_live must be >= 1, got {max_live}")
        self.control = control
        self.max_live = int(max_live)
        self.alpha = float(alpha)
        self.dtype = dtype
        self.weights_dir = Path(weights_dir)
        self.last_push: AdapterPush | None = None
        self._live: dict[int, LiveAdapter] = {}
        self._next_id = 1

    @property
    def live_versions(self) -> tuple[int, ...]:
        """The versions loaded now, oldest first."""
        return tuple(sorted(self._live))

    def get(self, version: int) -> LiveAdapter:
        """The loaded adapter of ``version``.

        Raises:
            PolicyError: it is not loaded (no adapter was pushed for it, or it was unloaded).
        """
        live = self._live.get(version)
        if live is None:
            raise PolicyError(
                f"no LoRA adapter is loaded for policy version {version} (loaded: "
                f"{list(self.live_versions)}); push the learner's adapter (load_weights) before sampling"
            )
        return live

    @asynccontextmanager
    async def use(self, version: int) -> AsyncIterator[LiveAdapter]:
        """Hold ``version``'s adapter for one turn: it is not unloaded until the turn is over. Entering does
        not suspend, so a caller that read the version just before cannot miss it."""
        live = self.get(version)
        live.users += 1
        live.released.clear()
        try:
            yield live
        finally:
            live.users -= 1
            if live.users == 0:
                live.released.set()

    async def push(self, update: WeightUpdate) -> AdapterPush:
        """Load ``update``'s adapter as version ``update.version``, unloading the oldest versions beyond
        ``max_live`` (each after its turns in flight finish); return once every worker reports it.

        The caller keeps new turns from starting meanwhile (the policy's update gate).

        Raises:
            PolicyError: the engine refused the adapter, or a worker holds other tensors than the learner's.
        """
        from agentrl.lora import adapter_digest

        t0 = time.perf_counter()
        tensors = {k: v for k, v in update.named_tensors.items() if ".lora_A." in k or ".lora_B." in k}
        if len(tensors) != len(update.named_tensors):
            raise ConfigError(
                "a vLLM LoRA sampler takes the adapter's tensors alone (agentrl.lora.published_state), got "
                f"{len(update.named_tensors) - len(tensors)} other tensors"
            )
        want = adapter_digest(tensors)
        want_engine = engine_digest(tensors, alpha=self.alpha, dtype=self.dtype)
        name = f"agentrl-v{update.version}"
        folder = self.weights_dir / f"agentrl-lora-v{update.version}-{uuid.uuid4().hex[:8]}"
        try:
            size = write_adapter(tensors, alpha=self.alpha, folder=folder)
            t1 = time.perf_counter()
            unloaded = await self._make_room(update.version)
            lora_id = self._next_id
            self._next_id += 1
            await self.control.add_adapter(name, lora_id, str(folder))
            lora_id = await self._find(want_engine, lora_id, name)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        push = AdapterPush(update.version, name, lora_id, want, want_engine, size, t1 - t0,
                           time.perf_counter() - t1, unloaded)  # fmt: skip
        self._live[update.version] = LiveAdapter(push, folder)
        self.last_push = push
        return push

    async def _make_room(self, version: int) -> tuple[int, ...]:
        gone: list[int] = []
        while self._live and (version in self._live or len(self._live) >= self.max_live):
            victim = version if version in self._live else min(self._live)
            live = self._live[victim]
            if live.users:
                await live.released.wait()  # its turns in flight finish on their version
                continue
            del self._live[victim]
            try:
                await self.control.remove_adapter(live.push.name, live.push.lora_id)
            finally:
                shutil.rmtree(live.folder, ignore_errors=True)
            gone.append(victim)
        return tuple(gone)

    async def _checksums(self) -> list[dict[str, str]]:
        raw = await self.control.collective_rpc(CHECKSUMS_METHOD)
        if not raw:
            raise PolicyError("vLLM ran the adapter checksum on no worker")
        try:
            return [{str(k): str(v) for k, v in json.loads(str(r)).items()} for r in raw]
        except (ValueError, AttributeError) as e:
            raise PolicyError(f"vLLM workers answered {raw!r} for their adapters' checksums") from e

    async def _find(self, want_engine: str, lora_id: int, name: str) -> int:
        """The id under which every worker holds the adapter with ``want_engine``; ``lora_id`` when the caller
        picked ids (in process), else the one the server assigned."""
        per_worker = await self._checksums()
        taken = {a.push.lora_id for a in self._live.values()}
        ids: set[int] | None = None
        for held in per_worker:
            match = {int(i) for i, d in held.items() if d == want_engine and int(i) not in taken}
            ids = match if ids is None else ids & match
        if not ids:
            got = [sorted(h.values()) for h in per_worker]
            raise PolicyError(
                f"adapter {name} did not reach the vLLM workers: none holds the learner's adapter "
                f"(engine digest {want_engine[:16]}; they hold {got}); the engine would keep sampling an "
                "older adapter"
            )
        return lora_id if lora_id in ids else max(ids)

    async def served(self, version: int) -> ServedAdapter:
        """Ask the workers which adapter they hold for ``version``: its learner-side digest when every worker
        holds exactly the tensors pushed for it."""
        live = self._live.get(version)
        if live is None:
            return ServedAdapter(version, "missing", self.live_versions)
        per_worker = await self._checksums()
        got = {h.get(str(live.push.lora_id), "missing") for h in per_worker}
        if got == {live.push.engine_sha256}:
            return ServedAdapter(version, live.push.sha256, self.live_versions)
        return ServedAdapter(version, "engine:" + ",".join(sorted(got)), self.live_versions)

    def forget(self) -> None:
        """Forget every version and delete the adapter folders (the engine is being shut down)."""
        for live in self._live.values():
            shutil.rmtree(live.folder, ignore_errors=True)
        self._live.clear()
