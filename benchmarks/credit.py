"""Credit-assignment benchmarks, side by side in one run; writes docs/benchmarks/credit.md.

1. OTB advantages at B=2048, T=2048 (groups of 8, interleaved tool spans): the vectorised
   ``agentrl.credit.optimal_token_baseline`` against the plain-loop reference kept in
   tests/credit/otb_reference.py (verl-style loops over rows and groups). Same inputs, outputs compared.
2. The learner's log-prob + Σπ² pass (``agentrl.learner.forward_logprobs``) against a naive version
   (full logits → full fp32 log_softmax → gather, softmax² sum) at T=8192 with a 49,152-token vocabulary
   (SmolLM2's size) on a small random-init Llama. Each variant runs in its own subprocess; peak memory is
   the process's RSS high-water mark (``ru_maxrss``) minus its RSS just before the pass.
3. Numerics of the energy proxy (spec §2.4): naive ``1 − 2π + Σπ²`` vs the stable form, in fp32, against
   fp64 truth.

Usage: python benchmarks/credit.py [--quick] [--out docs/benchmarks/credit.md]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def load_reference():
    spec = importlib.util.spec_from_file_location(
        "otb_reference", ROOT / "tests" / "credit" / "otb_reference.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -------------------------------------------------------------------------------------------------
# 1. OTB vectorised vs loop
# -------------------------------------------------------------------------------------------------
def make_otb_inputs(B: int, T: int, group: int, seed: int = 0, dtype=torch.float32):
    """Rows: a prompt (mask 0), then model turns interleaved with tool spans (mask 0), then padding.
    Per-token π(y) is peaked (most tokens near-certain, as in real rollouts)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=dtype)
    rew = torch.zeros(B, T, dtype=dtype)
    lengths = torch.randint(T // 8, T + 1, (B,), generator=g)
    for i in range(B):  # data generation only; not timed
        n = int(lengths[i])
        pos = int(torch.randint(32, 128, (1,), generator=g))  # prompt
        last = -1
        while pos < n:
            turn = int(torch.randint(16, 256, (1,), generator=g))
            end = min(pos + turn, n)
            mask[i, pos:end] = 1
            last = end - 1
            pos = end + int(torch.randint(8, 160, (1,), generator=g))  # tool output span
        if last >= 0:
            rew[i, last] = float(torch.randint(0, 2, (1,), generator=g))
    z = torch.randn(B, T, generator=g, dtype=torch.float64) * 2.5 + 3.0
    p = torch.sigmoid(z)  # π(y): median ~0.95, a long tail towards 1
    frac = torch.rand(B, T, generator=g, dtype=torch.float64)
    lp = torch.log(p).to(dtype)
    sp = (p * p + frac * (1 - p) ** 2).to(dtype)
    groups = [f"task{i // group}" for i in range(B)]
    return rew, mask, lp, sp, groups


def bench_otb(B: int, T: int, group: int, loop_groups: int | None, reps: int) -> dict:
    from agentrl.credit import optimal_token_baseline

    ref = load_reference()
    # Inputs are generated in float64 (consistent π(y), Σπ² pairs) and rounded once to float32.
    rew64, mask64, lp64, sp64, groups = make_otb_inputs(B, T, group, dtype=torch.float64)
    rew, mask, lp, sp = (x.float() for x in (rew64, mask64, lp64, sp64))
    # The loop version on the whole batch or on the first `loop_groups` groups (extrapolated linearly:
    # its cost is a sum over independent rows and groups).
    rows = B if loop_groups is None else min(B, loop_groups * group)
    sl = slice(0, rows)
    out = optimal_token_baseline(rew, mask, lp, sp, groups)  # warm-up
    t_vec, t_loop = [], []
    for _ in range(reps):  # interleaved, best of `reps` each: the machine may be shared
        t0 = time.perf_counter()
        out = optimal_token_baseline(rew, mask, lp, sp, groups)
        t_vec.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        loop_out = ref.tir_otb_loop(rew[sl], mask[sl], lp[sl], sp[sl], groups[:rows])
        t_loop.append((time.perf_counter() - t0) * (B / rows))
    # Ground truth: the loop in float64 on the float64 inputs.
    truth = ref.tir_otb_loop(rew64[sl], mask64[sl], lp64[sl], sp64[sl], groups[:rows])
    vec64 = optimal_token_baseline(rew64, mask64, lp64, sp64, groups)
    return {
        "B": B,
        "T": T,
        "group": group,
        "model_tokens": int(mask.sum()),
        "vectorised_s": min(t_vec),
        "loop_s": min(t_loop),
        "vectorised_all_s": t_vec,
        "loop_all_s": t_loop,
        "loop_rows_timed": rows,
        "loop_extrapolated": rows < B,
        "speedup": min(t_loop) / min(t_vec),
        "max_abs_diff_fp64": float((vec64[sl] - truth).abs().max()),
        "max_abs_diff_fp32": float((out[sl] - loop_out).abs().max()),
        "vec32_err": float((out[sl].double() - truth).abs().max()),
        "loop32_err": float((loop_out.double() - truth).abs().max()),
        "adv_scale": float(out.abs().max()),
    }


# -------------------------------------------------------------------------------------------------
# 2. Learner forward: chunked vs naive (one subprocess per variant)
# -------------------------------------------------------------------------------------------------
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def forward_worker(
    variant: str, T: int, V: int, hidden: int, layers: int, reps: int, grad: bool, out_dir: str
):
    """Runs in a subprocess: build the model, run one pass to measure peak memory, then time `reps`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrl.learner import forward_logprobs

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=V,
        max_position_embeddings=T,
        tie_word_embeddings=True,  # as SmolLM2
    )
    model = LlamaForCausalLM(cfg)
    if not grad:
        model.requires_grad_(False)
    ids = torch.randint(0, V, (1, T))
    attn = torch.ones(1, T, dtype=torch.long)

    def naive():
        logits = model(input_ids=ids, attention_mask=attn).logits.float()
        ls = torch.log_softmax(logits[:, :-1], dim=-1)
        lp = ls.gather(-1, ids[:, 1:, None]).squeeze(-1)
        sp = torch.softmax(logits[:, :-1], dim=-1).square().sum(-1)
        return lp, sp

    def chunked():
        out = forward_logprobs(model, ids, attn, chunk_size=1024, with_sum_pi_squared=True)
        return out.logprobs_B_T[:, 1:], out.sum_pi_squared_B_T[:, 1:]

    fn = naive if variant == "naive" else chunked

    def run():
        if grad:
            lp, sp = fn()
            lp.sum().backward()
            model.zero_grad(set_to_none=True)
            return lp.detach(), sp.detach()
        with torch.no_grad():
            return fn()

    rss0 = _rss_bytes()
    t0 = time.perf_counter()
    lp, sp = run()
    first = time.perf_counter() - t0
    peak = _maxrss_bytes()
    times = [first]
    for _ in range(reps - 1):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    torch.save({"lp": lp, "sp": sp}, os.path.join(out_dir, f"{variant}.pt"))
    print(
        json.dumps(
            {
                "variant": variant,
                "grad": grad,
                "rss_before": rss0,
                "peak_rss": peak,
                "extra_peak": peak - rss0,
                "time_s": min(times),
                "times": times,
            }
        )
    )


def bench_forward(T: int, V: int, hidden: int, layers: int, reps: int, grad: bool) -> dict:
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in ("naive", "chunked"):
            cmd = [sys.executable, __file__, "--worker", variant, str(T), str(V), str(hidden)]
            cmd += [str(layers), str(reps), str(int(grad)), tmp]
            p = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if p.returncode != 0:
                raise RuntimeError(f"{variant} worker failed:\n{p.stderr[-3000:]}")
            res[variant] = json.loads(p.stdout.strip().splitlines()[-1])
        a = torch.load(os.path.join(tmp, "naive.pt"))
        b = torch.load(os.path.join(tmp, "chunked.pt"))
    res["max_abs_diff_logprobs"] = float((a["lp"] - b["lp"]).abs().max())
    res["max_abs_diff_spi2"] = float((a["sp"] - b["sp"]).abs().max())
    res["memory_ratio"] = res["chunked"]["extra_peak"] / res["naive"]["extra_peak"]
    res["speed_ratio"] = res["naive"]["time_s"] / res["chunked"]["time_s"]
    res.update({"T": T, "V": V, "hidden": hidden, "layers": layers, "grad": grad})
    return res


# -------------------------------------------------------------------------------------------------
# 3. Energy numerics
# -------------------------------------------------------------------------------------------------
def bench_energy(n: int = 20000, V: int = 4096) -> dict:
    from agentrl.credit import sum_pi_squared, token_energy

    g = torch.Generator().manual_seed(1)
    # Logit scales from flat to extremely peaked, so π(y) spans [~0, 1 − 1e-9].
    scale = torch.logspace(-1, 1.6, n, dtype=torch.float64)[:, None]
    z64 = torch.randn(n, V, generator=g, dtype=torch.float64) * scale
    p64 = torch.softmax(z64, -1)
    y = torch.multinomial(p64.float(), 1, generator=g).squeeze(1)
    py = p64.gather(1, y[:, None]).squeeze(1)
    sp64 = p64.square().sum(-1)
    true = (1 - py) ** 2 + (sp64 - py.square()).clamp(min=0)
    tiny = true < 1e-6
    res: dict = {"tokens": n, "frac_true_below_1e-6": float(tiny.float().mean())}

    def score(tag: str, lp32: torch.Tensor, sp32: torch.Tensor) -> None:
        naive = (1 - 2 * torch.exp(lp32) + sp32).double()
        stable = token_energy(lp32, sp32).double()
        for form, w in (("naive", naive), ("stable", stable)):
            rel = (w - true).abs() / true.clamp(min=1e-300)
            res[f"{tag}_{form}_max_abs_err"] = float((w - true).abs().max())
            res[f"{tag}_{form}_negative"] = int((w < 0).sum())
            res[f"{tag}_{form}_zero"] = int((w == 0).sum())
            res[f"{tag}_{form}_median_rel_err_tiny"] = float(rel[tiny].median()) if tiny.any() else 0.0
            res[f"{tag}_{form}_max_rel_err_tiny"] = float(rel[tiny].max()) if tiny.any() else 0.0

    # (a) exact inputs rounded once to fp32: isolates the formula's own error.
    score("rounded", torch.log(py).float(), sp64.float())
    # (b) end to end as the learner computes them: fp32 log_softmax and Σπ² from fp32 logits.
    z32 = z64.float()
    score("pipeline", torch.log_softmax(z32, -1).gather(1, y[:, None]).squeeze(1), sum_pi_squared(z32))
    return res


def otb_naive_vs_stable(B: int, T: int, group: int) -> float:
    """Max |A_stable − A_naive| from the energy form alone: both computed in float64 arithmetic on the
    same fp32-rounded inputs (the loop reference uses the naive form)."""
    from agentrl.credit import optimal_token_baseline

    ref = load_reference()
    rew, mask, lp, sp, groups = make_otb_inputs(B, T, group, seed=5, dtype=torch.float64)
    rew, mask, lp, sp = (x.float().double() for x in (rew, mask, lp, sp))
    a = optimal_token_baseline(rew, mask, lp, sp, groups)
    return float((a - ref.tir_otb_loop(rew, mask, lp, sp, groups)).abs().max())


# -------------------------------------------------------------------------------------------------
def fmt(xs: list[float]) -> str:
    return ", ".join(f"{x:.3f}" for x in xs)


def gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def write_md(path: Path, otb: dict, fwd: dict, fwd_grad: dict | None, energy: dict, meta: dict):
    lines = [
        "# Credit-assignment benchmarks",
        "",
        f"Run: `python benchmarks/credit.py{meta['args']}` on {meta['machine']}, torch {meta['torch']}, "
        f"{meta['threads']} threads, {meta['date']}. 1-minute load average at start/end: "
        f"{meta['load'][0]:.1f} / {meta['load'][1]:.1f} (the machine was shared with other jobs; "
        "timings are best-of-N and the ratios come from interleaved or back-to-back runs).",
        "",
        "## 1. OTB advantages: vectorised vs loop",
        "",
        f"B = {otb['B']}, T = {otb['T']}, groups of {otb['group']}, prompt + model turns interleaved "
        f"with tool spans, {otb['model_tokens']:,} model tokens, float32.",
        "",
        "| version | time | speed-up |",
        "|---|---|---|",
        f"| loop reference (tests/credit/otb_reference.py) | {otb['loop_s']:.2f} s"
        + (
            f" (timed on {otb['loop_rows_timed']} rows, extrapolated linearly)"
            if otb["loop_extrapolated"]
            else ""
        )
        + " | 1.0× |",
        f"| `optimal_token_baseline` | {otb['vectorised_s']:.3f} s | **{otb['speedup']:.1f}×** |",
        "",
        f"Outputs: in float64 the two agree to max |Δ| = {otb['max_abs_diff_fp64']:.1e} (identical up "
        f"to summation order). In float32 they differ by up to {otb['max_abs_diff_fp32']:.1e} "
        f"(advantages are O({otb['adv_scale']:.0f})); against the float64 result the vectorised "
        f"version is off by {otb['vec32_err']:.1e}, the loop by {otb['loop32_err']:.1e}. Both sum in "
        "float32; the differences come from the energy form (§3: the loop uses the naive "
        "1 − 2π + Σπ², which cancels for confident tokens) and summation order. Timings: best of "
        f"{len(otb['loop_all_s'])} interleaved runs each (the five fastest: vectorised "
        f"{fmt(sorted(otb['vectorised_all_s'])[:5])} s; loop {fmt(sorted(otb['loop_all_s'])[:5])} s).",
        "",
        "## 2. Learner log-prob + Σπ² pass: chunked vs naive",
        "",
    ]

    def fwd_table(r: dict, title: str) -> list[str]:
        n, c = r["naive"], r["chunked"]
        return [
            f"{title}: T = {r['T']}, vocabulary {r['V']:,}, random-init Llama (hidden {r['hidden']}, "
            f"{r['layers']} layers, tied embeddings), batch 1, CPU fp32.",
            "",
            "| version | extra peak RSS | time |",
            "|---|---|---|",
            f"| naive: full logits, fp32 log_softmax, softmax² | {gib(n['extra_peak'])} | "
            f"{n['time_s']:.2f} s |",
            f"| `forward_logprobs` (chunk 1024) | {gib(c['extra_peak'])} | {c['time_s']:.2f} s |",
            f"| ratio | **{r['memory_ratio']:.3f}×** memory | **{r['speed_ratio']:.2f}×** speed |",
            "",
            f"Max |Δ| log-prob {r['max_abs_diff_logprobs']:.1e}, Σπ² {r['max_abs_diff_spi2']:.1e}. "
            "Extra peak RSS = the subprocess's RSS high-water mark minus its RSS just before the pass "
            "(model and inputs already built); time = best of the runs."
            + (
                " With gradients each chunk's logits are recomputed in backward (checkpointing of "
                "the LM head), one extra [chunk, V] matmul per chunk: memory for time."
                if r["grad"]
                else ""
            ),
            "",
        ]

    lines += fwd_table(fwd, "Scoring pass (no grad, what `Learner.score` runs)")
    if fwd_grad is not None:
        lines += fwd_table(
            fwd_grad, "Training pass (forward + backward of Σ log π, what `Learner.step` runs)"
        )
    e = energy

    def erow(tag: str, form: str, label: str) -> str:
        k = f"{tag}_{form}_"
        return (
            f"| {label} | {e[k + 'max_abs_err']:.1e} | {e[k + 'negative']} | {e[k + 'zero']} | "
            f"{e[k + 'median_rel_err_tiny']:.1e} | {e[k + 'max_rel_err_tiny']:.1e} |"
        )

    lines += [
        "## 3. Energy proxy numerics (spec §2.4)",
        "",
        f"{e['tokens']:,} sampled tokens from softmax distributions ranging from flat to extremely "
        f"peaked (V = 4096); truth = ‖e_y − π‖² in fp64; {e['frac_true_below_1e-6']:.0%} of the "
        "tokens have true w < 1e-6. Inputs in fp32 either (a) rounded once from the exact values, "
        "isolating the formula, or (b) computed as the learner does (fp32 log_softmax and Σπ² from "
        "fp32 logits).",
        "",
        "| inputs, form | max abs err | w < 0 | w = 0 | median rel. err (w < 1e-6) | max rel. err "
        "(w < 1e-6) |",
        "|---|---|---|---|---|---|",
        erow("rounded", "naive", "(a) naive 1 − 2π + Σπ²"),
        erow("rounded", "stable", "(a) stable"),
        erow("pipeline", "naive", "(b) naive"),
        erow("pipeline", "stable", "(b) stable"),
        "",
        "Stable form: (1 − π)² from expm1(log π) plus clamp(Σπ² − π², 0, (1 − π)²). Both forms agree "
        "where w is not tiny (differences at the fp32 rounding level of Σπ², ~1e-7). Where π(y) → 1 "
        "the naive form cancels (zeros, negative values, errors of order 100 %); with correctly "
        "rounded inputs the stable form is never negative and within a factor 2 of the truth "
        "(relative error ≤ 1). End to end (b) both are limited by the fp32 log-prob itself (its "
        "absolute error is ~ulp of the logits' magnitude), which the formula cannot undo; the stable "
        "form still never goes negative. Effect of the energy form alone on OTB advantages "
        "(benchmark-1 data rounded to fp32, both evaluated in fp64): max |A_stable − A_naive| = "
        f"{meta['otb_naive_vs_stable']:.1e}, from tokens whose rounded (π, Σπ²) pair is inconsistent.",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        v, T, V, h, L, reps, grad, out_dir = sys.argv[2:10]
        forward_worker(v, int(T), int(V), int(h), int(L), int(reps), bool(int(grad)), out_dir)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--no-grad-pass", action="store_true", help="skip the training-pass comparison")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "credit.md"))
    args = ap.parse_args()
    if args.quick:
        B, T, loop_groups, Tf, V = 256, 256, None, 1024, 8192
    else:
        B, T, loop_groups, Tf, V = 2048, 2048, None, 8192, 49152
    load0 = os.getloadavg()[0]
    print(f"[credit] OTB B={B} T={T} ...", flush=True)
    otb = bench_otb(B, T, 8, loop_groups, reps=15)
    print(json.dumps(otb, indent=1), flush=True)
    print(f"[credit] forward T={Tf} V={V} ...", flush=True)
    fwd = bench_forward(Tf, V, hidden=256, layers=2, reps=3, grad=False)
    print(json.dumps(fwd, indent=1), flush=True)
    fwd_grad = None
    if not args.no_grad_pass:
        fwd_grad = bench_forward(Tf, V, hidden=256, layers=2, reps=2, grad=True)
        print(json.dumps(fwd_grad, indent=1), flush=True)
    energy = bench_energy()
    print(json.dumps(energy, indent=1), flush=True)
    meta = {
        "args": " --quick" if args.quick else "",
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
        "otb_naive_vs_stable": otb_naive_vs_stable(min(B, 512), T, 8),
        "load": (load0, os.getloadavg()[0]),
    }
    write_md(Path(args.out), otb, fwd, fwd_grad, energy, meta)
    print(f"[credit] wrote {args.out}")


if __name__ == "__main__":
    main()
