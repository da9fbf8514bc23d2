"""VLLMPolicy: in-process vLLM (GPU machines; ``pip install agentrl[vllm]``). ``vllm`` is imported lazily.

The engine is created with ``logprobs_mode="processed_logprobs"`` so returned log-probs are those of the
distribution actually sampled (after temperature / top-p), which is what the learner's importance ratios
need. Prompts go in as token ids and sampled ids come back as ids; nothing is re-tokenized.

Not exercised on CPU-only machines (vLLM does not install there); keep it small and typed against
:class:`agentrl.protocols.Policy`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from agentrl.errors import ConfigError, PolicyError
from agentrl.protocols import FinishReason, Generation, Sampling, WeightUpdate

__all__ = ["VLLMPolicy"]


class VLLMPolicy:
    """An in-process ``vllm`` async engine behind the Policy protocol; the trainer pushes new weights with
    :meth:`load_weights` (an :class:`~agentrl.protocols.UpdatablePolicy`).

    Args:
        model: A local model folder (e.g. :func:`agentrl.models.smollm2_dir`).
        stop_token_ids: Ids that end a turn (give the renderer the same).
        version: Initial weights version.
        **engine_kwargs: Passed to ``vllm.AsyncEngineArgs`` (``gpu_memory_utilization``, ``dtype``,
            ``max_model_len``, ...). ``logprobs_mode`` defaults to ``"processed_logprobs"``.
    """

    def __init__(self, model: str, *, stop_token_ids: Sequence[int], version: int = 0, **engine_kwargs: Any):
        try:
            import vllm
        except ImportError as e:  # pragma: no cover - depends on the machine
            raise ConfigError("VLLMPolicy needs vllm (GPU machines): pip install 'agentrl[vllm]'") from e
        if not stop_token_ids:
            raise ConfigError("VLLMPolicy needs stop_token_ids")
        engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        args = vllm.AsyncEngineArgs(model=str(model), **engine_kwargs)
        self.engine = vllm.AsyncLLMEngine.from_engine_args(args)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self._version = int(version)
        self._ids = itertools.count()

    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = int(version)

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            logprobs=0,
            stop_token_ids=list(self.stop_token_ids),
            skip_special_tokens=False,
            detokenize=False,
        )
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
        o = final.outputs[0]
        ids = [int(t) for t in o.token_ids]
        if o.logprobs is None or len(o.logprobs) != len(ids):
            raise PolicyError("vLLM returned no per-token log-probs")
        lps = []
        for t, d in zip(ids, o.logprobs, strict=True):
            lp = d[t].logprob if t in d else None
            if lp is None or not math.isfinite(lp):
                raise PolicyError(f"vLLM returned no log-prob for sampled id {t}")
            lps.append(min(float(lp), 0.0))
        finish = FinishReason.STOP if o.finish_reason == "stop" else FinishReason.LENGTH
        if finish is FinishReason.STOP and (not ids or ids[-1] not in self.stop_token_ids):
            raise PolicyError("vLLM stopped without returning the stop token id")
        return Generation(tuple(ids), tuple(lps), finish, version)

    async def load_weights(self, update: WeightUpdate) -> None:
        """Push new weights into the engine in memory, without writing to disk, then take
        ``update.version`` (:class:`~agentrl.protocols.WeightSink`).

        Uses the engine's ``collective_rpc`` to call ``model.load_weights`` on every worker; needs a vLLM
        whose workers run in-process or can receive pickled tensors. Requests running meanwhile are not
        paused (the synchronous trainer publishes between rollouts); the prefix cache is reset so no cached
        key/value of the old weights is reused.
        """
        update.check_after(self._version)
        batch = list(update.named_tensors.items())

        def _load(worker: Any) -> None:
            worker.model_runner.model.load_weights(weights=batch)

        try:
            await self.engine.collective_rpc(_load)
            if hasattr(self.engine, "reset_prefix_cache"):
                await self.engine.reset_prefix_cache()
        except Exception as e:
            raise PolicyError(f"loading weights into vLLM failed: {e!r}") from e
        self._version = update.version
