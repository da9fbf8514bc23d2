"""LoRA on vLLM without vLLM: the adapter folder a vLLM sampler loads is a real peft adapter (peft loads it
back to the learner's tensors), and the per-version bookkeeping (at most ``max_live`` versions, a turn in
flight keeps its version's adapter, a sync that never reaches the workers fails) runs against an engine that
registers adapters as vLLM's workers do. The real engine runs in tests/policies/test_vllm_lora_engine.py
(marker ``vllm``)."""

from __future__ import annotations

import asyncio
import copy
import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.errors import ConfigError, PolicyError
from agentrl.lora import LoraConfig, adapter_digest, apply_lora, published_state
from agentrl.lora_sync import read_syncs, verify_served
from agentrl.models import tiny_model
from agentrl.policies.vllm_lora import (
    CHECKSUMS_METHOD,
    LiveAdapters,
    engine_digest,
    engine_lora_kwargs,
    write_adapter,
)
from agentrl.policies.vllm_worker import checksum, lora_engine_form
from agentrl.protocols import WeightUpdate
from agentrl.run import RunDir

LORA = LoraConfig(rank=4, alpha=8.0)


def _adapted(tok, seed=0):
    return apply_lora(tiny_model(tok, seed=seed), LORA, name="tiny", seed=seed)


def _step(model, seed: int) -> None:
    """An optimizer step's effect on the adapter: every LoRA tensor moves in place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_" in n:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)


class Workers:
    """An engine whose one worker registers an adapter folder the way vLLM's does: it reads the folder's
    config and tensors and keeps them in vLLM's form (:func:`lora_engine_form`); ``deliver=False`` is the
    verl #7495 engine that accepts the load call and keeps nothing."""

    def __init__(self, *, deliver: bool = True):
        self.deliver = deliver
        self.held: dict[int, str] = {}
        self.calls: list[tuple[str, str]] = []

    async def add_adapter(self, name: str, lora_id: int, path: str) -> None:
        self.calls.append(("add", name))
        if self.deliver:
            cfg = json.loads((Path(path) / "adapter_config.json").read_text())
            tensors = load_file(str(Path(path) / "adapter_model.safetensors"))
            form = lora_engine_form(tensors.items(), cfg["lora_alpha"] / cfg["r"], torch.float32)
            self.held[lora_id] = checksum(form.items())

    async def remove_adapter(self, name: str, lora_id: int) -> None:
        self.calls.append(("remove", name))
        self.held.pop(lora_id, None)

    async def collective_rpc(self, method: str, *args: str) -> list[str]:
        assert method == CHECKSUMS_METHOD
        return [json.dumps({str(k): v for k, v in self.held.items()})]


def _live(workers: Workers, tmp_path: Path, max_live: int = 2) -> LiveAdapters:
    return LiveAdapters(
        workers, max_live=max_live, alpha=LORA.alpha, dtype=torch.float32, weights_dir=tmp_path
    )


def test_the_adapter_folder_is_a_peft_adapter_of_the_learners_tensors(tok, tmp_path):
    import peft

    adapted = _adapted(tok)
    _step(adapted.model, 1)
    state = published_state(adapted.model)
    size = write_adapter(state, alpha=LORA.alpha, folder=tmp_path / "a")
    assert size == sum(p.stat().st_size for p in (tmp_path / "a").iterdir())
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8.0
    assert cfg["target_modules"] == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    # peft loads the folder onto a fresh base: the same adapter, and the same outputs as the learner's model.
    with warnings.catch_warnings():  # peft reads a name transformers 5 deprecates (as agentrl.lora notes)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        loaded = peft.PeftModel.from_pretrained(tiny_model(tok, seed=0), str(tmp_path / "a"))
    assert adapter_digest(loaded.get_base_model()) == adapter_digest(adapted.model)
    ids = torch.tensor([[5, 17, 300, 42]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, adapted.model(input_ids=ids).logits)
    # The engine-form digest of the file equals the one computed from the learner's tensors.
    on_disk = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    assert engine_digest(on_disk, alpha=8.0, dtype=torch.float32) == engine_digest(
        state, alpha=8.0, dtype=torch.float32
    )


def test_engine_settings_round_the_rank_up_to_one_vllm_accepts():
    assert engine_lora_kwargs(4, 2) == {
        "enable_lora": True,
        "max_loras": 2,
        "max_lora_rank": 8,
        "max_cpu_loras": 2,
    }
    assert engine_lora_kwargs(16, 1)["max_lora_rank"] == 16
    with pytest.raises(ConfigError, match="up to 512"):
        engine_lora_kwargs(600, 1)
    with pytest.raises(ConfigError, match="rank >= 1"):
        engine_lora_kwargs(0, 1)


async def test_at_most_max_live_versions_and_the_oldest_goes_first(tok, tmp_path):
    adapted = _adapted(tok)
    workers = Workers()
    live = _live(workers, tmp_path, max_live=2)
    digests = []
    for v in range(4):
        _step(adapted.model, v)
        push = await live.push(WeightUpdate(v, published_state(adapted.model)))
        digests.append(push.sha256)
        assert push.sha256 == adapter_digest(adapted.model) and push.bytes > 0
        assert len(workers.held) <= 2 and live.live_versions == tuple(range(max(0, v - 1), v + 1))
        assert push.unloaded == ((v - 2,) if v >= 2 else ())
    assert len(set(digests)) == 4  # every step's adapter differs
    assert [c for c in workers.calls if c[0] == "remove"] == [
        ("remove", "agentrl-v0"),
        ("remove", "agentrl-v1"),
    ]
    assert sorted(p.name.split("-")[2] for p in tmp_path.iterdir()) == ["v2", "v3"]  # old folders deleted
    served = await live.served(3)
    assert served.sha256 == digests[3] and served.live == (2, 3)
    with pytest.raises(PolicyError, match="no LoRA adapter is loaded for policy version 1"):
        async with live.use(1):
            pass


async def test_a_turn_in_flight_keeps_its_version_until_it_ends(tok, tmp_path):
    adapted = _adapted(tok)
    workers = Workers()
    live = _live(workers, tmp_path, max_live=1)  # --max-staleness 0: one version at a time
    await live.push(WeightUpdate(0, published_state(adapted.model)))
    turn_ended = asyncio.Event()

    async def turn() -> str:
        async with live.use(0) as a:
            await asyncio.sleep(0.05)  # sampling
            held = workers.held.get(a.push.lora_id)  # still registered while the turn runs
            turn_ended.set()
            return str(held)

    v0 = live.get(0).push.engine_sha256
    task = asyncio.create_task(turn())
    await asyncio.sleep(0)  # the turn has started on version 0
    _step(adapted.model, 1)
    push = await live.push(WeightUpdate(1, published_state(adapted.model)))
    assert turn_ended.is_set() and push.unloaded == (0,)  # the push waited for the turn, then unloaded v0
    assert await task == v0  # to its last token the turn had version 0's adapter
    assert live.live_versions == (1,) and push.engine_sha256 != v0


async def test_a_sync_that_never_reaches_the_workers_fails(tok, tmp_path):
    """verl #7495: the load call succeeds, the workers keep the old adapter; the push must not."""
    adapted = _adapted(tok)
    workers = Workers()
    live = _live(workers, tmp_path, max_live=2)
    await live.push(WeightUpdate(0, published_state(adapted.model)))
    workers.deliver = False
    _step(adapted.model, 1)
    with pytest.raises(PolicyError, match="did not reach the vLLM workers"):
        await live.push(WeightUpdate(1, published_state(adapted.model)))
    assert live.live_versions == (0,) and len(list(tmp_path.iterdir())) == 1  # its folder is gone


class Sampler:
    """A vLLM LoRA sampler as the trainer sees it: a version and ``served_adapter()``."""

    def __init__(self, live: LiveAdapters):
        self.live = live
        self.version = 0

    async def served_adapter(self):
        return await self.live.served(self.version)


async def test_verify_served_records_each_sync_and_catches_a_stale_adapter(tok, tmp_path):
    adapted = _adapted(tok)
    workers = Workers()
    live = _live(workers, tmp_path / "w", max_live=2)
    (tmp_path / "w").mkdir()
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    sampler = Sampler(live)
    await live.push(WeightUpdate(0, published_state(adapted.model)))
    first = await verify_served(run, sampler, adapted.model, 0, "vllm")
    _step(adapted.model, 1)
    await live.push(WeightUpdate(1, published_state(adapted.model)))
    sampler.version = 1
    second = await verify_served(run, sampler, adapted.model, 1, "vllm")
    assert first.sha256 != second.sha256  # the served adapter changed after the step
    assert [s.version for s in read_syncs(run)] == [0, 1]
    # The workers' copy of version 1 is replaced by other tensors (a load that went to the wrong place).
    stale = copy.deepcopy(adapted.model)
    _step(stale, 2)
    other = lora_engine_form(published_state(stale).items(), LORA.alpha / LORA.rank, torch.float32)
    workers.held[live.get(1).push.lora_id] = checksum(other.items())
    with pytest.raises(PolicyError, match="adapter sync to version 1 failed"):
        await verify_served(run, sampler, adapted.model, 1, "vllm")
    # A learner that stepped without a sync: the sampler still serves the old adapter.
    workers.held[live.get(1).push.lora_id] = live.get(1).push.engine_sha256
    _step(adapted.model, 3)
    with pytest.raises(PolicyError, match="adapter sync to version 1 failed"):
        await verify_served(run, sampler, adapted.model, 1, "vllm")


def test_a_full_weight_update_is_refused_by_a_lora_sampler(tok, tmp_path):
    live = _live(Workers(), tmp_path)
    with pytest.raises(ConfigError, match="adapter's tensors alone"):
        asyncio.run(live.push(WeightUpdate(0, dict(_adapted(tok).model.state_dict()))))
