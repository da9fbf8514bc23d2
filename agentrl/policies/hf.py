"""HFPolicy: a transformers model as a token-in/token-out policy with exact sampler log-probs, served by the
continuous-batching :class:`~agentrl.policies.engine.GenerationEngine`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.errors import ConfigError
from agentrl.policies.engine import DEFAULT_CACHE_BYTES, EngineStats, GenerationEngine
from agentrl.policies.engine import nucleus as _nucleus
from agentrl.protocols import Generation, Sampling, WeightUpdate

__all__ = ["HFPolicy"]
_ = _nucleus  # re-exported for callers that imported it from here


class HFPolicy:
    """A Hugging Face causal LM behind the :class:`~agentrl.protocols.Policy` protocol.

    Concurrent :meth:`generate` calls (from many episodes) share one
    :class:`~agentrl.policies.engine.GenerationEngine`: a turn that ends leaves the running batch at once and
    a waiting one joins at the next decode step, so no episode waits for the slowest of a batch and one
    episode's tool call overlaps the others' decoding. An episode's next turn reuses the KV of its
    conversation so far (longest-prefix match on token ids; only the new tokens are prefilled), and the
    episodes of a group share their prompt's KV. Each row has its own temperature, top-p,
    ``max_new_tokens`` and random stream (``sampling.seed``), and stops at the first of ``stop_token_ids``
    (kept in the output). The recorded log-prob of each token is ``log_softmax(logits / temperature)`` at the
    sampled id — the distribution actually sampled — and, with ``top_p < 1``, of the renormalized nucleus.
    Recomputing it with one forward pass over the trajectory (what the learner does) agrees to ~1e-6 in fp32.

    Torch work runs in a worker thread (``asyncio.to_thread``) so the event loop keeps serving environments
    and tools while the model samples.

    Sharing weights with a learner (same process, e.g. on CPU): pass the learner's model object, update it
    inside ``with policy.lock:`` (held during every engine step) and call :meth:`set_version` with the
    learner step before releasing the lock: turns started from then on record it, and no KV computed with
    the old weights is reused. A turn running across an update finishes with the new weights (its recorded
    log-probs are still exactly those it was sampled from) and records the version it started with.

    Args:
        model: A full-attention causal LM (``sdpa`` or ``eager`` attention; Llama, Qwen2, SmolLM2, ...).
        tokenizer: Its tokenizer (for default stop ids and the pad id); optional if both are given.
        stop_token_ids: Ids that end a turn. Default: as :class:`~agentrl.chat.ChatRenderer` picks them.
            Give the policy and the renderer the same ids.
        device: Where to run (default: the model's device).
        max_batch_size: Most requests decoded together.
        batch_wait_s: How long the driver waits for more requests before it starts stepping.
        version: Initial weights version.
        seed: Seed of the stream used by requests without ``sampling.seed``.
        pad_token_id: Id at padding positions (masked). Default: the tokenizer's, else the first stop id.
        cache_bytes: Byte budget of the KV prefix cache (0 turns reuse off).
        max_prefill_tokens: Most prompt tokens prefilled per engine step.
        packed_weights: Decode on pre-packed weight copies (faster small-batch steps on CPU; see
            :class:`~agentrl.policies.engine.GenerationEngine`). ``None``: on where it applies.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        stop_token_ids: Sequence[int] | None = None,
        device: Any = None,
        max_batch_size: int = 16,
        batch_wait_s: float = 0.0,
        version: int = 0,
        seed: int | None = None,
        pad_token_id: int | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_prefill_tokens: int = 2048,
        packed_weights: bool | None = None,
    ):
        if batch_wait_s < 0:
            raise ConfigError(f"batch_wait_s must be >= 0, got {batch_wait_s!r}")
        self.tokenizer = tokenizer
        if stop_token_ids is None:
            if tokenizer is None:
                raise ConfigError("HFPolicy needs stop_token_ids or a tokenizer to derive them from")
            from agentrl.chat import _default_stop_ids

            stop_token_ids = _default_stop_ids(tokenizer)
        if not stop_token_ids:
            raise ConfigError("HFPolicy needs at least one stop token id")
        self.stop_token_ids: tuple[int, ...] = tuple(int(t) for t in stop_token_ids)
        if pad_token_id is None:
            pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
            pad_token_id = pad if isinstance(pad, int) else self.stop_token_ids[0]
        self.pad_token_id = int(pad_token_id)
        self.batch_wait_s = batch_wait_s
        self.engine = GenerationEngine(
            model,
            stop_token_ids=self.stop_token_ids,
            pad_token_id=self.pad_token_id,
            max_batch_size=max_batch_size,
            cache_bytes=cache_bytes,
            max_prefill_tokens=max_prefill_tokens,
            device=device,
            seed=seed,
            version=version,
            packed_weights=packed_weights,
        )
        self.device = self.engine.device
        self.vocab_size = self.engine.vocab_size
        self.max_batch_size = max_batch_size
        self.lock = self.engine.lock
        """Held during every engine step; hold it to change the weights in place."""
        self._task: asyncio.Task[None] | None = None
        self._task_loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------------------------------
    @property
    def model(self) -> Any:
        """The model the engine runs."""
        return self.engine.model

    @model.setter
    def model(self, model: Any) -> None:
        self.engine.model = model

    @property
    def batch_sizes(self) -> Sequence[int]:
        """Rows in each recent decode step (the running batch; for tests and tuning)."""
        return self.engine.batch_sizes

    @property
    def version(self) -> int:
        """Version of the current weights."""
        return self.engine.version

    def set_version(self, version: int) -> None:
        """Tell the policy its weights changed (the learner step that produced them); drops stale KV."""
        self.engine.set_version(version)

    def stats(self) -> EngineStats:
        """The engine's counters (tokens sampled, prefilled, reused from the cache, ...)."""
        return self.engine.stats()

    def clear_cache(self) -> None:
        """Give the KV cache's memory back (e.g. before a learner step); later turns recompute it."""
        self.engine.clear_cache()

    async def load_weights(self, update: WeightUpdate) -> None:
        """Take new weights (:class:`~agentrl.protocols.WeightSink`).

        Tensors that already are this model's own (a learner sharing the model object) cost nothing; others
        are copied in under :attr:`lock`, so an engine step never sees half-updated weights. The engine takes
        the new version under the same lock: turns admitted afterwards record it, and no KV computed with the
        old weights is reused (a turn running across the update finishes with the new weights, records the
        version it started with, and its KV is not cached)."""
        update.check_after(self.version)
        own = self.model.state_dict(keep_vars=True)
        unknown = sorted(set(update.named_tensors) - set(own))
        if unknown:
            raise ConfigError(f"the update names tensors this model does not have: {unknown[:5]}")
        copies = []
        for name, src in update.named_tensors.items():
            dst = own[name]
            if tuple(src.shape) != tuple(dst.shape):
                raise ConfigError(f"{name}: the update's shape {tuple(src.shape)} is not {tuple(dst.shape)}")
            if src.data_ptr() != dst.data_ptr():
                copies.append((dst, src))

        def take() -> None:
            import torch

            with self.lock, torch.no_grad():
                for dst, src in copies:
                    dst.copy_(src)
                self.engine.set_version(update.version)

        await asyncio.to_thread(take)

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Sample one turn; decoded together with every other call in flight."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Generation] = loop.create_future()

        def on_done(out: Generation | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(_resolve, fut, out)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

        req = self.engine.submit(prompt_ids, sampling, on_done)
        if self._task is None or self._task.done() or self._task_loop is not loop:
            self._task = loop.create_task(self._drive())
            self._task_loop = loop
        try:
            return await fut
        except asyncio.CancelledError:
            self.engine.cancel(req)  # leaves the batch at the next step
            raise

    async def _drive(self) -> None:
        # Runs while requests are waiting or running, then exits (so no task outlives the loop that made it).
        while self.engine.has_work():
            # Yield once (or wait a little) so episodes that are about to ask join the first step.
            await asyncio.sleep(self.batch_wait_s)
            await asyncio.to_thread(self.engine.run)

    # ------------------------------------------------------------------------------------------
    def generate_batch_sync(
        self,
        prompts: Sequence[Sequence[int]],
        samplings: Sequence[Sampling],
        *,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Generation]:
        """Sample one turn for each prompt (blocking; thread-safe; shares steps with requests in flight).

        ``should_stop`` is polled once per token; when it returns True the unfinished requests end early
        with ``FinishReason.LENGTH`` (the caller discards them).
        """
        return self.engine.generate_sync(prompts, samplings, should_stop=should_stop)


def _resolve(fut: asyncio.Future[Generation], out: Generation | BaseException) -> None:
    if fut.done():  # cancelled by its episode
        return
    if isinstance(out, BaseException):
        fut.set_exception(out)
    else:
        fut.set_result(out)
