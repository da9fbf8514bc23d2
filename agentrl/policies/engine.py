"""GenerationEngine: continuous batching over a transformers causal LM, with KV reuse across turns and groups.

The core is synchronous and thread-agnostic: :meth:`GenerationEngine.submit` (any thread) queues a request,
and whoever drives the engine (HFPolicy's worker thread, a Ray actor's loop, ``while engine.step(): pass``)
calls :meth:`GenerationEngine.step`. One step

1. admits waiting requests into free rows, each taking the longest cached prefix of its prompt from the
   :class:`~agentrl.policies.kvcache.PrefixTree` (its previous turn, or its group's prompt) and prefilling
   only the rest (logits for the last position only); a request sharing a longer prefix with one admitted in
   the same step waits for that one's prefill and reuses it;
2. decodes one token for every running row in one forward over rows of different lengths (per-row KV slots,
   an explicit 4D mask; on CPU linear layers use pre-packed weights, :mod:`~agentrl.policies.packed`);
3. retires finished rows at once (stop token or ``max_new_tokens``): their KV goes into the prefix tree for
   the next turn, and the row is free at the next step.

Sampling: ``log_softmax(logits / temperature)`` (renormalized over the nucleus when ``top_p < 1``); the token
is drawn by an exponential race (Gumbel-max) whose noise comes from the request's own ``torch.Generator``
seeded with ``sampling.seed``, so a seeded request's tokens do not depend on its batch-mates or arrival order,
up to floating-point differences between batch shapes. The recorded log-prob is that of the sampled token
under the distribution sampled from.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.errors import ConfigError, PolicyError
from agentrl.models import cache_kwarg, keep_arg, keeps_logits_per_row, pick_kept
from agentrl.policies.kvcache import KVSpec, PrefixMatch, PrefixTree, SlotCache, _common_prefix
from agentrl.policies.lean import lean_for
from agentrl.policies.packed import InferenceTwin, use_packed
from agentrl.policies.sampling import exponential_race, new_noise_buffer, nucleus
from agentrl.protocols import FinishReason, Generation, Sampling

__all__ = ["DEFAULT_CACHE_BYTES", "EngineRequest", "EngineStats", "GenerationEngine", "nucleus"]

DEFAULT_CACHE_BYTES = 512 * 2**20
"""Default byte budget of the prefix tree (512 MiB: a default rollout's KV for SmolLM2-135M in fp32)."""

_SHARE_MIN = 16  # a request waits for a batch-mate's prefill only if that saves at least this many tokens
_FIRST_RESERVE = 512  # positions reserved beyond a prompt at admission; rows grow the buffer on demand


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters since the engine was created (a snapshot)."""

    requests: int
    """Requests submitted."""
    decode_steps: int
    """Decode forwards run."""
    decode_rows: int
    """Rows over all decode forwards (``decode_rows / decode_steps`` is the mean running batch)."""
    sampled_tokens: int
    """Tokens sampled (prefill and decode)."""
    prefill_forwards: int
    """Prefill forwards run."""
    prefill_tokens: int
    """Prompt tokens run through the model (excluding padding)."""
    reused_tokens: int
    """Prompt tokens whose KV came from the prefix tree instead."""
    cache_bytes: int
    """Bytes the prefix tree holds now."""
    cache_evictions: int
    """Prefix-tree nodes evicted to stay within budget."""
    slot_bytes: int
    """Bytes reserved by the running rows' KV buffer now."""
    step_s: float
    """Seconds spent in steps (forwards, sampling, cache bookkeeping; lock waits excluded)."""
    forward_s: float
    """Seconds of those spent in model forwards."""
    packed_bytes: int = 0
    """Bytes held by the pre-packed decode weights now (0 when off or dropped)."""


class EngineRequest:
    """A request in the engine: its prompt, settings, and the tokens sampled so far (filled by the engine)."""

    __slots__ = (
        "cancelled",
        "done",
        "error",
        "finish",
        "logprobs",
        "on_done",
        "prompt_ids",
        "rng",
        "sampling",
        "token_ids",
        "version",
    )

    def __init__(
        self,
        prompt_ids: tuple[int, ...],
        sampling: Sampling,
        on_done: Callable[[Generation | BaseException], None] | None,
        rng: torch.Generator,
    ):
        self.prompt_ids = prompt_ids
        self.sampling = sampling
        self.on_done = on_done
        self.rng = rng
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish: FinishReason | None = None
        self.version = 0
        self.error: PolicyError | None = None
        self.cancelled = False
        self.done = False

    def result(self) -> Generation:
        """The tokens so far as a :class:`Generation` (LENGTH if the request did not finish)."""
        return Generation(
            tuple(self.token_ids), tuple(self.logprobs), self.finish or FinishReason.LENGTH, self.version
        )


class _Row:
    __slots__ = ("length", "req")

    def __init__(self, req: EngineRequest):
        self.req = req
        self.length = 0  # positions of this row's slot that hold KV


class GenerationEngine:
    """Continuous-batching sampler over a transformers causal LM (see the module docstring).

    Args:
        model: A full-attention causal LM (Llama, Qwen2, ... with ``sdpa`` or ``eager`` attention).
        stop_token_ids: Ids that end a turn (kept in the output).
        pad_token_id: Id fed at padding positions of a prefill (masked; any valid id).
        max_batch_size: Most rows decoded together.
        cache_bytes: Byte budget of the prefix tree (0 turns KV reuse off).
        max_prefill_tokens: Prompt tokens prefilled per step at most (at least one request is admitted), so
            a burst of long prompts does not stall the running rows for long.
        device: Where to run (default: the model's device).
        seed: Seed of the shared stream used by requests without ``sampling.seed``.
        lock: Held during every step (share it with whoever updates the weights in place).
        release_when_idle: Free the rows' KV buffer when nothing is running (its size follows the longest
            row; the prefix tree keeps what the next turns need).
        version: Initial weights version.
        packed_weights: Decode on packed weights (:mod:`~agentrl.policies.packed`; :meth:`clear_cache` frees
            them): ``True`` every linear layer, ``None`` (fp32, CPU) the shapes faster packed on this CPU.
        lean_forward: Run forwards without transformers' module dispatch where the model is supported
            (:func:`~agentrl.policies.lean.lean_for`: ``None`` on CPU unless ``AGENTRL_LEAN_DECODE=0``).
    """

    def __init__(
        self,
        model: Any,
        *,
        stop_token_ids: Sequence[int],
        pad_token_id: int = 0,
        max_batch_size: int = 16,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_prefill_tokens: int = 2048,
        device: Any = None,
        seed: int | None = None,
        lock: threading.RLock | None = None,
        release_when_idle: bool = True,
        version: int = 0,
        packed_weights: bool | None = None,
        lean_forward: bool | None = None,
    ):
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be a positive int, got {max_batch_size!r}")
        if not isinstance(max_prefill_tokens, int) or max_prefill_tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be a positive int, got {max_prefill_tokens!r}")
        if not stop_token_ids:
            raise ConfigError("the generation engine needs at least one stop token id")
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.packed_weights = use_packed(packed_weights, self.device, next(model.parameters()).dtype)
        self._model, self._pack_all = model, packed_weights is True
        self._twin = InferenceTwin(model, pack_all=self._pack_all) if self.packed_weights else None
        self._lean_req, self._lean = lean_forward, lean_for(model, self._twin, lean_forward, self.device)
        self.spec = KVSpec.from_model(model, self.device)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.release_when_idle = release_when_idle
        self.lock = lock if lock is not None else threading.RLock()
        self._cache_kw = cache_kwarg(model)
        self._row_keep = keeps_logits_per_row(model)
        self._eager = getattr(model.config, "_attn_implementation", None) == "eager"
        self._rng = torch.Generator(device=self.device)
        if seed is not None:
            self._rng.manual_seed(seed)
        else:
            self._rng.seed()
        self._slots = SlotCache(self.spec, max_batch_size)
        self._noise: torch.Tensor | None = None  # the sampler's noise, kept across steps (sampling.py)
        self._tree = PrefixTree(cache_bytes)
        self._rows: list[_Row] = []
        self._waiting: collections.deque[EngineRequest] = collections.deque()
        self._admitting: list[EngineRequest] = []  # taken off the queue in this step (failed with it)
        self._qlock = threading.Lock()
        self._wakeup = threading.Event()  # set by submit, for serve()
        self._version = int(version)
        self._tree_version = self._version
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=4096)
        """Requests that sampled a token in each recent step (admitted in it, or decoded)."""
        self._time = {"step": 0.0, "forward": 0.0}
        self._n = dict.fromkeys(
            ("requests", "decode_steps", "decode_rows", "sampled", "prefills", "prefill_tokens", "reused"), 0
        )

    # -- front: any thread ----------------------------------------------------------------------
    @property
    def model(self) -> Any:
        """The model sampled from (its weights may change in place; the engine notices)."""
        return self._model

    @model.setter
    def model(self, model: Any) -> None:
        with self.lock:
            self._model = model
            on = self.packed_weights and model is not None
            self._twin = InferenceTwin(model, pack_all=self._pack_all) if on else None
            self._lean = (
                lean_for(model, self._twin, self._lean_req, self.device) if model is not None else None
            )

    @property
    def lean(self) -> bool:
        """Whether forwards run on :class:`~agentrl.policies.lean.LeanForward` (while no hook is set)."""
        return self._lean is not None

    @property
    def version(self) -> int:
        """Version of the current weights."""
        return self._version

    def set_version(self, version: int) -> None:
        """The weights changed: requests admitted from now on record ``version``, and no KV computed with
        the old weights is reused (the prefix tree is dropped now if the engine is not mid-step, else at the
        start of the next step)."""
        self._version = int(version)
        if self.lock.acquire(blocking=False):
            try:
                self._refresh_version()
            finally:
                self.lock.release()

    def submit(
        self,
        prompt_ids: Sequence[int],
        sampling: Sampling,
        on_done: Callable[[Generation | BaseException], None] | None = None,
    ) -> EngineRequest:
        """Queue one turn; ``on_done`` is called (from the driving thread, outside the lock) with the
        :class:`Generation` or a :class:`PolicyError`. Cancelled requests are never called back."""
        ids = tuple(int(t) for t in prompt_ids)
        if not ids:
            raise PolicyError("cannot generate from an empty prompt")
        for t in ids:
            if not 0 <= t < self.vocab_size:
                raise PolicyError(f"prompt token id {t} is outside the model's vocabulary")
        if sampling.seed is not None:
            rng = torch.Generator(device=self.device)
            rng.manual_seed(int(sampling.seed))
        else:
            rng = self._rng
        req = EngineRequest(ids, sampling, on_done, rng)
        with self._qlock:
            self._waiting.append(req)
            self._n["requests"] += 1
        self._wakeup.set()
        return req

    def cancel(self, req: EngineRequest) -> None:
        """Stop working on ``req``: it leaves the batch at the next step and is never called back."""
        req.cancelled = True

    def has_work(self) -> bool:
        """Whether a request is running or waiting."""
        if self._rows:
            return True
        with self._qlock:
            return any(not r.cancelled for r in self._waiting)

    def stats(self) -> EngineStats:
        """Counters so far."""
        n = self._n
        return EngineStats(
            requests=n["requests"],
            decode_steps=n["decode_steps"],
            decode_rows=n["decode_rows"],
            sampled_tokens=n["sampled"],
            prefill_forwards=n["prefills"],
            prefill_tokens=n["prefill_tokens"],
            reused_tokens=n["reused"],
            cache_bytes=self._tree.nbytes,
            cache_evictions=self._tree.evictions,
            slot_bytes=self._slots.nbytes,
            step_s=self._time["step"],
            forward_s=self._time["forward"],
            packed_bytes=self._twin.packed_bytes if self._twin is not None else 0,
        )

    def clear_cache(self) -> None:
        """Drop the prefix tree and the packed weights (and the rows' buffer if nothing runs) to give the
        memory back; the packs are rebuilt at the next step."""
        with self.lock:
            self._tree.clear()
            self._noise = None
            if self._twin is not None:
                self._twin.drop()
            if not self._rows:
                self._slots.release()

    # -- drivers -----------------------------------------------------------------------------------
    def run(self) -> None:
        """Step until no request is running or waiting (then free the rows' buffer if so configured)."""
        while self.step():
            pass
        self._purge()

    def serve(self, stop: threading.Event, poll_s: float = 0.05) -> None:
        """Drive the engine from a dedicated thread (e.g. an inference server's) until ``stop`` is set,
        sleeping while there is no work (a :meth:`submit` wakes it)."""
        while not stop.is_set():
            self._wakeup.clear()
            if self.has_work():
                self.step()
                continue
            self._purge()
            self._wakeup.wait(poll_s)

    def generate_sync(
        self,
        prompts: Sequence[Sequence[int]],
        samplings: Sequence[Sampling],
        *,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Generation]:
        """Sample one turn per prompt, blocking; other submitted requests share the steps.

        ``should_stop`` is polled after every step (one token per running row); when it returns True the
        unfinished requests are cancelled and come back with what they have, as ``FinishReason.LENGTH``.
        """
        if len(prompts) != len(samplings):
            raise ConfigError("prompts and samplings must have the same length")
        reqs = [self.submit(p, s) for p, s in zip(prompts, samplings, strict=True)]
        try:
            while not all(r.done for r in reqs):
                self.step()
                if should_stop is not None and not all(r.done for r in reqs) and should_stop():
                    break
        finally:
            for r in reqs:
                if not r.done:
                    self.cancel(r)
            self._purge()
        for r in reqs:
            if r.error is not None:
                raise r.error
        return [r.result() for r in reqs]

    # -- the step ----------------------------------------------------------------------------------
    def step(self) -> bool:
        """Admit waiting requests, decode one token for every running row, retire finished rows.

        Returns whether work remains. A failing forward fails the requests in it with :class:`PolicyError`
        (the engine stays usable).
        """
        finished: list[tuple[EngineRequest, Generation | BaseException]] = []
        with self.lock, torch.inference_mode():
            t0 = time.perf_counter()
            try:
                self._refresh_version()
                self._drop_cancelled()
                if self._twin is not None and self.has_work():
                    self._twin.refresh()
                n_old = len(self._rows)
                self._admit()
                n_new = len(self._rows) - n_old
                self._decode(n_old)
                if n_old or n_new:
                    self.batch_sizes.append(n_old + n_new)
                finished = self._retire()
            except Exception as e:
                err = e if isinstance(e, PolicyError) else PolicyError(f"generation failed: {e!r}")
                hit = {id(r): r for r in [row.req for row in self._rows] + self._admitting if not r.done}
                finished = [(r, err) for r in hit.values()]
                self._rows.clear()
                self._slots.release()
                self._tree.clear()
            self._admitting = []
            self._time["step"] += time.perf_counter() - t0
        for req, out in finished:
            req.done = True
            if isinstance(out, PolicyError):
                req.error = out
            if req.on_done is not None and not req.cancelled:
                req.on_done(out)
        return self.has_work()

    def _refresh_version(self) -> None:
        if self._tree_version != self._version:
            self._tree.clear()
            self._tree_version = self._version

    def _purge(self) -> None:
        with self.lock:
            self._drop_cancelled()
            if self.release_when_idle and not self._rows:
                self._slots.release()

    def _drop_cancelled(self) -> None:
        gone = [i for i, row in enumerate(self._rows) if row.req.cancelled]
        for i in reversed(gone):
            self._rows[i].req.done = True
            self._remove_row(i)

    def _remove_row(self, i: int) -> None:
        last = len(self._rows) - 1
        if i != last:  # keep the running rows contiguous: the last row moves into the hole
            self._slots.move_row(last, i, self._rows[last].length)
            self._rows[i] = self._rows[last]
        self._rows.pop()

    # -- admission and prefill ----------------------------------------------------------------------
    def _admit(self) -> None:
        free = self.max_batch_size - len(self._rows)
        if free <= 0:
            return
        cands: list[EngineRequest] = []
        with self._qlock:
            while self._waiting and len(cands) < free:
                r = self._waiting.popleft()
                if not r.cancelled:
                    cands.append(r)
        self._admitting = list(cands)
        leftover: list[EngineRequest] = []
        spent = 0
        while cands:
            chosen: list[tuple[EngineRequest, PrefixMatch]] = []
            deferred: list[EngineRequest] = []
            for r in cands:
                m = self._match(r.prompt_ids)
                # A batch-mate admitted in this round shares a longer prefix: prefill after it, reusing it.
                shared = (_common_prefix(c.prompt_ids, r.prompt_ids, 0, len(r.prompt_ids)) for c, _ in chosen)
                if any(n >= m.length + _SHARE_MIN for n in shared):
                    deferred.append(r)
                    continue
                cost = len(r.prompt_ids) - m.length
                if spent and spent + cost > self.max_prefill_tokens:
                    leftover.append(r)
                    continue
                chosen.append((r, m))
                spent += cost
            self._prefill(chosen)
            cands = deferred
        if leftover:
            with self._qlock:
                self._waiting.extendleft(reversed(leftover))

    def _match(self, ids: tuple[int, ...]) -> PrefixMatch:
        if self._tree.budget_bytes == 0:
            return PrefixMatch(0, ())
        return self._tree.match(ids, len(ids) - 1)  # the last prompt token is always run (its logits)

    def _prefill(self, chosen: list[tuple[EngineRequest, PrefixMatch]]) -> None:
        # Longest suffix first, cut into buckets that waste at most a third of their positions on padding.
        def suffix(rm: tuple[EngineRequest, PrefixMatch]) -> int:
            return len(rm[0].prompt_ids) - rm[1].length

        bucket: list[tuple[EngineRequest, PrefixMatch]] = []
        for rm in sorted(chosen, key=suffix, reverse=True):
            if bucket and (len(bucket) + 1) * suffix(bucket[0]) > 1.5 * (
                sum(map(suffix, bucket)) + suffix(rm)
            ):
                self._prefill_bucket(bucket)
                bucket = []
            bucket.append(rm)
        if bucket:
            self._prefill_bucket(bucket)

    def _prefill_bucket(self, bucket: list[tuple[EngineRequest, PrefixMatch]]) -> None:
        suffix = [len(r.prompt_ids) - m.length for r, m in bucket]
        Q = max(suffix)
        self._slots.reserve(
            max(
                max(m.length + Q for _, m in bucket),
                max(len(r.prompt_ids) + min(r.sampling.max_new_tokens, _FIRST_RESERVE) for r, _ in bucket),
            )
        )
        start = len(self._rows)
        rows: list[_Row] = []
        ids_B_Q = torch.full((len(bucket), Q), self.pad_token_id, dtype=torch.long)
        for b, (r, m) in enumerate(bucket):
            row = _Row(r)
            r.version = self._tree_version
            slot = start + b
            for pos, kv in m.segments:
                self._slots.write(slot, pos, kv)
            ids_B_Q[b, : suffix[b]] = torch.tensor(r.prompt_ids[m.length :], dtype=torch.long)
            row.length = len(r.prompt_ids)
            rows.append(row)
            self._rows.append(row)
            self._n["reused"] += m.length
            self._n["prefill_tokens"] += suffix[b]
        dev = self.device
        offsets_B = torch.tensor([m.length for _, m in bucket], dtype=torch.long)
        pos_B_Q = (offsets_B[:, None] + torch.arange(Q)[None, :]).to(dev)
        last_B_1 = torch.tensor([[s - 1] for s in suffix], dtype=torch.long, device=dev)
        logits_B_V = self._forward(start, ids_B_Q.to(dev), pos_B_Q, int(offsets_B.max()) + Q, last_B_1)
        self._n["prefills"] += 1
        if self._tree.budget_bytes:
            for b, row in enumerate(rows):
                self._tree.insert(row.req.prompt_ids, self._slots.reader(start + b))
        self._sample(rows, logits_B_V)

    # -- decode ----------------------------------------------------------------------------------
    def _decode(self, n: int) -> None:
        rows = self._rows[:n]  # finished rows were retired in the step that finished them
        if not n:
            return
        dev = self.device
        pos_B_1 = torch.tensor([[row.length] for row in rows], dtype=torch.long, device=dev)
        kv_len = max(row.length for row in rows) + 1
        self._slots.reserve(kv_len)
        ids_B_1 = torch.tensor([[row.req.token_ids[-1]] for row in rows], dtype=torch.long, device=dev)
        logits_B_V = self._forward(0, ids_B_1, pos_B_1, kv_len, None)
        for row in rows:
            row.length += 1
        self._n["decode_steps"] += 1
        self._n["decode_rows"] += n
        self._sample(rows, logits_B_V)

    def _forward(
        self, start: int, ids_B_Q: Any, pos_B_Q: Any, kv_len: int, logits_to_keep: Any
    ) -> torch.Tensor:
        """Run rows ``[start, start + B)``; returns the logits of the position each row samples from."""
        self._slots.set_window(start, pos_B_Q, kv_len)
        t0 = time.perf_counter()
        if self._lean is not None and self._lean.usable():  # no transformers dispatch, mask or cache calls
            logits_B_V = self._lean(self._slots, ids_B_Q, pos_B_Q, kv_len, logits_to_keep)
            self._time["forward"] += time.perf_counter() - t0
            return logits_B_V
        # Query at position p sees keys at positions <= p of its own row: the cached prefix, its own
        # earlier tokens, never another row's or a stale tail.
        keep_B_1_Q_K = (torch.arange(kv_len, device=self.device) <= pos_B_Q[:, :, None])[:, None]
        mask: torch.Tensor = keep_B_1_Q_K
        if self._eager:  # eager attention adds its mask to the scores
            mask = torch.zeros(keep_B_1_Q_K.shape, dtype=self.spec.dtype, device=self.device)
            mask.masked_fill_(~keep_B_1_Q_K, torch.finfo(self.spec.dtype).min)
        kwargs: dict[str, Any] = {self._cache_kw: self._slots}
        if logits_to_keep is not None:
            kwargs["logits_to_keep"] = keep_arg(logits_to_keep, ids_B_Q.shape[1], self._row_keep)
        run = self._twin.module if self._twin is not None else self._model
        with self._slots.attention():
            out = run(input_ids=ids_B_Q, attention_mask=mask, position_ids=pos_B_Q, use_cache=True, **kwargs)
        self._time["forward"] += time.perf_counter() - t0
        return pick_kept(out.logits, logits_to_keep, self._row_keep)

    # -- sampling and retirement -------------------------------------------------------------------
    def _sample(self, rows: list[_Row], logits_B_V: torch.Tensor) -> None:
        if self._noise is None or self._noise.device != logits_B_V.device:
            self._noise = new_noise_buffer(self.max_batch_size, logits_B_V)
        toks, lps = exponential_race(
            logits_B_V, [row.req.sampling for row in rows], [row.req.rng for row in rows], self._noise
        )
        for row, tok, lp in zip(rows, toks, lps, strict=True):
            req = row.req
            req.token_ids.append(tok)
            req.logprobs.append(lp)
            if tok in self.stop_token_ids:
                req.finish = FinishReason.STOP
            elif len(req.token_ids) >= req.sampling.max_new_tokens:
                req.finish = FinishReason.LENGTH
        self._n["sampled"] += len(rows)

    def _retire(self) -> list[tuple[EngineRequest, Generation | BaseException]]:
        out: list[tuple[EngineRequest, Generation | BaseException]] = []
        for i in reversed(range(len(self._rows))):
            row = self._rows[i]
            if row.req.finish is None:
                continue
            req = row.req
            # Rows that ran across a weight update hold KV of both versions: not reusable.
            if self._tree.budget_bytes and not req.cancelled and req.version == self._tree_version:
                # The conversation so far, minus the last sampled token (never fed, so it has no KV yet).
                seq = (*req.prompt_ids, *req.token_ids)[: row.length]
                self._tree.insert(seq, self._slots.reader(i))
            self._remove_row(i)
            out.append((req, req.result()))
        out.reverse()
        return out
