"""HFPolicy: a transformers model as a batched, token-in/token-out policy with exact sampler log-probs."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.errors import ConfigError, PolicyError
from agentrl.protocols import FinishReason, Generation, Sampling, WeightUpdate

__all__ = ["HFPolicy"]


@dataclass(slots=True)
class _Request:
    prompt_ids: tuple[int, ...]
    sampling: Sampling
    future: asyncio.Future[Generation]


class HFPolicy:
    """A Hugging Face causal LM behind the :class:`~agentrl.protocols.Policy` protocol.

    Concurrent :meth:`generate` calls (from many episodes) are collected by a background task into one
    batch: prompts are left-padded, run through the model once, then decoded step by step with a KV cache.
    Each row has its own temperature, top-p, ``max_new_tokens`` and seed, and stops at the first of
    ``stop_token_ids`` (which is kept in the output). The recorded log-prob of each token is
    ``log_softmax(logits / temperature)`` at the sampled id — the distribution actually sampled — and,
    with ``top_p < 1``, of the renormalized nucleus. Recomputing it with one forward pass over the
    trajectory (what the learner does) agrees to ~1e-6 in fp32.

    Torch work runs in a worker thread (``asyncio.to_thread``) so the event loop keeps serving
    environments and tools while the model samples. Batches are static: requests that arrive while a
    batch runs form the next one.

    Sharing weights with a learner (same process, e.g. on CPU): pass the learner's model object, and update
    it inside ``with policy.lock:`` (held for the duration of every batch), then call
    :meth:`set_version` with the learner step so new trajectories record it.

    Args:
        model: A causal LM (``model(input_ids, attention_mask, position_ids, past_key_values)``).
        tokenizer: Its tokenizer (for default stop ids and the pad id); optional if both are given.
        stop_token_ids: Ids that end a turn. Default: as :class:`~agentrl.chat.ChatRenderer` picks them.
            Give the policy and the renderer the same ids.
        device: Where to run (default: the model's device).
        max_batch_size: Most requests per batch.
        batch_wait_s: How long the batcher waits for more requests before starting a batch.
        version: Initial weights version.
        seed: Seed of the generator used for requests without ``sampling.seed``.
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
    ):
        import torch

        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be a positive int, got {max_batch_size!r}")
        if batch_wait_s < 0:
            raise ConfigError(f"batch_wait_s must be >= 0, got {batch_wait_s!r}")
        self.model = model
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
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self._version = int(version)
        # Sampling runs where the model is (only the chosen ids and log-probs cross to the CPU).
        self._generator = torch.Generator(device=self.device)
        if seed is not None:
            self._generator.manual_seed(seed)
        else:
            self._generator.seed()
        self.lock = threading.RLock()
        """Held while a batch runs; hold it to change the weights in place."""
        self._pending: list[_Request] = []
        self._task: asyncio.Task[None] | None = None
        self._task_loop: asyncio.AbstractEventLoop | None = None
        self.batch_sizes: list[int] = []
        """Size of every batch run so far (for tests and tuning)."""

    # ------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Version of the current weights."""
        return self._version

    def set_version(self, version: int) -> None:
        """Tell the policy its weights changed (the learner step that produced them)."""
        self._version = int(version)

    async def load_weights(self, update: WeightUpdate) -> None:
        """Take new weights (:class:`~agentrl.protocols.WeightSink`): tensors that already are this model's
        own (a learner sharing the model object) cost nothing; others are copied in under :attr:`lock`, so a
        running batch finishes with the weights it started with."""
        update.check_after(self._version)
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
                self._version = update.version

        await asyncio.to_thread(take)

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Sample one turn; batched with every other call in flight."""
        if not prompt_ids:
            raise PolicyError("cannot generate from an empty prompt")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Generation] = loop.create_future()
        self._pending.append(_Request(tuple(int(t) for t in prompt_ids), sampling, fut))
        if self._task is None or self._task.done() or self._task_loop is not loop:
            self._task = loop.create_task(self._drain())
            self._task_loop = loop
        return await fut

    async def _drain(self) -> None:
        # Runs while requests are waiting, then exits (so no task outlives the loop that made it).
        while self._pending:
            # Yield once (or wait a little) so episodes that are about to ask can join this batch.
            await asyncio.sleep(self.batch_wait_s)
            batch = self._pending[: self.max_batch_size]
            del self._pending[: self.max_batch_size]
            batch = [r for r in batch if not r.future.done()]  # cancelled by their episode
            if not batch:
                continue
            try:
                # If every episode waiting on this batch is cancelled (shutdown), the decode loop
                # stops at the next token instead of finishing a batch nobody will read.
                gens = await asyncio.to_thread(
                    self.generate_batch_sync,
                    [r.prompt_ids for r in batch],
                    [r.sampling for r in batch],
                    should_stop=functools.partial(_all_done, batch),
                )
            except asyncio.CancelledError:
                for r in batch:
                    if not r.future.done():
                        r.future.cancel()
                raise
            except Exception as e:
                err = e if isinstance(e, PolicyError) else PolicyError(f"HFPolicy generation failed: {e!r}")
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(err)
                continue
            for r, g in zip(batch, gens, strict=True):
                if not r.future.done():
                    r.future.set_result(g)

    # ------------------------------------------------------------------------------------------
    def generate_batch_sync(
        self,
        prompts: Sequence[Sequence[int]],
        samplings: Sequence[Sampling],
        *,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Generation]:
        """Sample one turn for each prompt in one batch (blocking; thread-safe through :attr:`lock`).

        ``should_stop`` is polled once per token; when it returns True the batch ends early and every
        unfinished row comes back with ``FinishReason.LENGTH`` (the caller discards such a batch).
        """
        import torch

        if len(prompts) != len(samplings):
            raise ConfigError("prompts and samplings must have the same length")
        B = len(prompts)
        if B == 0:
            return []
        for p in prompts:
            if not p:
                raise PolicyError("cannot generate from an empty prompt")
            for t in p:
                if not 0 <= t < self.vocab_size:
                    raise PolicyError(f"prompt token id {t} is outside the model's vocabulary")
        stops = frozenset(self.stop_token_ids)
        dev = self.device
        temps_B = torch.tensor([s.temperature for s in samplings], dtype=torch.float32, device=dev)
        max_new = [s.max_new_tokens for s in samplings]
        gens: list[torch.Generator | None] = []
        for s in samplings:
            if s.seed is None:
                gens.append(None)
            else:
                g = torch.Generator(device=dev)
                g.manual_seed(int(s.seed))
                gens.append(g)
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lps: list[list[float]] = [[] for _ in range(B)]
        finish: list[FinishReason | None] = [None] * B

        with self.lock, torch.inference_mode():
            # Read under the lock: load_weights swaps weights and version together under it.
            version = self._version
            L = max(len(p) for p in prompts)
            ids_B_L = torch.full((B, L), self.pad_token_id, dtype=torch.long)
            attn_B_L = torch.zeros((B, L), dtype=torch.long)
            for i, p in enumerate(prompts):
                ids_B_L[i, L - len(p) :] = torch.tensor(list(p), dtype=torch.long)
                attn_B_L[i, L - len(p) :] = 1
            pos_B_L = (attn_B_L.cumsum(-1) - 1).clamp(min=0)
            attn = attn_B_L.to(dev)
            cache = _new_cache(self.model)
            out = self.model(
                input_ids=ids_B_L.to(dev),
                attention_mask=attn,
                position_ids=pos_B_L.to(dev),
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            logits_B_V = out.logits[:, -1, :].float()
            next_pos_B = attn_B_L.sum(-1)  # position of the token about to be fed
            active = list(range(B))
            for _step in range(max(max_new)):
                logp_B_V = torch.log_softmax(logits_B_V / temps_B[:, None], dim=-1)
                next_B = torch.full((B,), self.pad_token_id, dtype=torch.long)
                for i in active:
                    lp_V = logp_B_V[i]
                    top_p = samplings[i].top_p
                    if top_p < 1.0:
                        lp_V = _nucleus(lp_V, top_p)
                    tok = int(torch.multinomial(lp_V.exp(), 1, generator=gens[i] or self._generator))
                    out_ids[i].append(tok)
                    out_lps[i].append(float(lp_V[tok]))
                    next_B[i] = tok
                    if tok in stops:
                        finish[i] = FinishReason.STOP
                    elif len(out_ids[i]) >= max_new[i]:
                        finish[i] = FinishReason.LENGTH
                active = [i for i in active if finish[i] is None]
                if not active or (should_stop is not None and should_stop()):
                    break
                attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=dev)], dim=-1)
                out = self.model(
                    input_ids=next_B[:, None].to(dev),
                    attention_mask=attn,
                    position_ids=next_pos_B[:, None].to(dev),
                    past_key_values=cache,
                    use_cache=True,
                )
                cache = out.past_key_values
                next_pos_B = next_pos_B + 1
                logits_B_V = out.logits[:, -1, :].float()
        self.batch_sizes.append(B)
        return [
            Generation(tuple(out_ids[i]), tuple(out_lps[i]), finish[i] or FinishReason.LENGTH, version)
            for i in range(B)
        ]


def _all_done(batch: Sequence[_Request]) -> bool:
    return all(r.future.done() for r in batch)


def _nucleus(logp_V: Any, top_p: float) -> Any:
    """Log-probs renormalized over the smallest set of tokens whose mass reaches ``top_p``."""
    import torch

    sorted_lp, order = torch.sort(logp_V, descending=True)
    cum = sorted_lp.exp().cumsum(-1)
    # Keep a token if the mass *before* it is < top_p (so the top token is always kept).
    keep_sorted = (cum - sorted_lp.exp()) < top_p
    keep = torch.zeros_like(keep_sorted)
    keep[order] = keep_sorted
    masked = logp_V.masked_fill(~keep, float("-inf"))
    return masked - torch.logsumexp(masked, dim=-1)


def _new_cache(model: Any) -> Any:
    try:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=model.config)
        except TypeError:
            return DynamicCache()
    except ImportError:  # pragma: no cover
        return None
