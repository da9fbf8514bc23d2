"""LoRA against full fine-tuning: a short `agentrl train` run each, and one weight sync each.

**Runs.** `agentrl train` on the defaults (SmolLM2-135M-Instruct fp32, math-tir-arith-v0, OTB), shortened by
the flags below, once with full fine-tuning and once with `--lora.rank R --learner.lr LR`, one after the
other in child processes under `/usr/bin/time -v`: peak RSS, wall time, the size of the newest checkpoint
(what a resume needs: weights or adapter, optimizer state, RNG) and of an older one (compacted for replay),
and the per-step metrics.

**Sync.** What a sampler with its own copy of the weights (a Ray inference server, an asynchronous run's
sampler) takes after a step: the full state dict against the adapter alone, through the shared-disk transport
(safetensors written by the learner, read by the server), loaded into an own-copy `HFPolicy` and checksummed
as the servers do; and through Ray's object store when Ray is installed (`ray.init` on this machine).

    flock /tmp/agentrl-heavy.lock nice -n 10 .venv/bin/python benchmarks/lora.py --steps 2 --groups-per-step 2

Writes docs/benchmarks/lora.json; the last lines are a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "docs" / "benchmarks" / "lora.json"
MIB = 2**20


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_train(out: Path, extra: list[str]) -> dict[str, Any]:
    """One `agentrl train` under /usr/bin/time -v."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "agentrl.trainers", "train", "--no-progress"]
    cmd += ["--out", str(out), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"agentrl train failed:\n{proc.stderr[-4000:]}")
    rss_kb = next(
        int(ln.split(": ", 1)[1]) for ln in proc.stderr.splitlines() if "Maximum resident set size" in ln
    )
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    ckpts = sorted((out / "checkpoints").glob("step-*"))
    evaluation = json.loads((out / "eval.json").read_text()) if (out / "eval.json").exists() else None
    return {
        "cmd": " ".join(cmd[3:]),
        "wall_s": wall,
        "peak_rss_gib": rss_kb * 1024 / 2**30,
        "newest_checkpoint_mib": _size(ckpts[-1]) / MIB,
        "older_checkpoint_mib": _size(ckpts[0]) / MIB if len(ckpts) > 1 else None,
        "step_s": [m.get("time/step_s") for m in metrics],
        "learn_s": [m.get("time/learn_s") for m in metrics],
        "reward_mean": [m.get("reward/mean") for m in metrics],
        "update_rel_norm": [m.get("learn/update_rel_norm") for m in metrics],
        "eval": evaluation,
        "stdout_tail": proc.stdout.splitlines()[-3:],
    }


def bench_sync(rank: int, repeats: int) -> dict[str, Any]:
    """Full state dict vs adapter: transport put + get, load into an own-copy HFPolicy, checksum."""
    import torch

    from agentrl.lora import LoraConfig, apply_lora, published_state
    from agentrl.models import ModelSpec, resolve_model
    from agentrl.policies import HFPolicy
    from agentrl.protocols import WeightUpdate
    from agentrl.trainers.ray.weights import SharedDiskTransport
    from agentrl.weights import weights_checksum

    loaded = resolve_model(ModelSpec("smollm2", device="cpu", dtype="float32"))
    full_model = loaded.model
    lora_model = copy.deepcopy(full_model)
    apply_lora(lora_model, LoraConfig(rank=rank), name="smollm2", seed=0)
    with torch.no_grad():  # a trained adapter: nonzero B
        for n, p in lora_model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 1e-3)
    out: dict[str, Any] = {}
    for label, model in (("full", full_model), ("lora", lora_model)):
        state = published_state(model)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        server = HFPolicy(copy.deepcopy(model), loaded.tokenizer, packed_weights=False)
        rows: dict[str, list[float]] = {"put_s": [], "get_s": [], "load_s": [], "checksum_s": []}
        with tempfile.TemporaryDirectory() as tmp:
            transport = SharedDiskTransport(tmp)
            for v in range(1, repeats + 1):
                t0 = time.perf_counter()
                ref = transport.put(v, state)
                t1 = time.perf_counter()
                got = transport.get(ref)
                t2 = time.perf_counter()
                asyncio.run(server.load_weights(WeightUpdate(v, got)))
                t3 = time.perf_counter()
                own = server.model.state_dict()
                assert weights_checksum({k: own[k] for k in got}) == ref.checksum
                t4 = time.perf_counter()
                for k, dt in zip(rows, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                    rows[k].append(dt)
        entry: dict[str, Any] = {"tensors": len(state), "mib": nbytes / MIB}
        entry.update({k: statistics.median(v) for k, v in rows.items()})
        entry["shared_disk_total_s"] = sum(entry[k] for k in rows)
        entry["object_store_put_get_s"] = _object_store(state, repeats)
        out[label] = entry
        del server
    return out


def _object_store(state: dict[str, Any], repeats: int) -> float | None:
    """Median ObjectStoreTransport put + get (Ray on this machine), None without Ray."""
    try:
        import ray
    except ImportError:
        return None
    from agentrl.trainers.ray.weights import ObjectStoreTransport

    if not ray.is_initialized():
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, object_store_memory=1200 * MIB)
    t = ObjectStoreTransport()
    times = []
    for v in range(repeats):
        t0 = time.perf_counter()
        ref = t.put(v, state)
        t.get(ref)
        times.append(time.perf_counter() - t0)
        del ref
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--groups-per-step", type=int, default=2)
    ap.add_argument("--eval-tasks", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lora-lr", type=float, default=3e-5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-args", default="", help="more `agentrl train` flags for both runs, one string")
    ap.add_argument("--skip-runs", action="store_true")
    ap.add_argument("--skip-sync", action="store_true")
    ns = ap.parse_args()
    common = ["--steps", str(ns.steps), "--groups-per-step", str(ns.groups_per_step), "--seed", str(ns.seed)]
    common += ["--eval.tasks", str(ns.eval_tasks), *ns.train_args.split()]
    result: dict[str, Any] = {
        "machine": f"{platform.machine()} 2-core CPU, contended by parallel work",
        "args": vars(ns),
    }
    if not ns.skip_runs:
        with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
            result["full"] = run_train(Path(tmp) / "full", common)
            lora = ["--lora.rank", str(ns.rank), "--learner.lr", str(ns.lora_lr)]
            result["lora"] = run_train(Path(tmp) / "lora", [*common, *lora])
    if not ns.skip_sync:
        result["sync"] = bench_sync(ns.rank, ns.repeats)
    STORE.parent.mkdir(parents=True, exist_ok=True)
    STORE.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str))
    if "full" in result:
        print("| | peak RSS | wall | newest checkpoint | older checkpoint |")
        print("|---|---|---|---|---|")
        for k in ("full", "lora"):
            r = result[k]
            old = r["older_checkpoint_mib"]
            print(
                f"| {k} | {r['peak_rss_gib']:.2f} GiB | {r['wall_s']:.0f} s "
                f"| {r['newest_checkpoint_mib']:.1f} MiB | {'-' if old is None else f'{old:.1f} MiB'} |"
            )
    if "sync" in result:
        print("| sync | MiB | put | get | load | checksum | shared disk total | object store put+get |")
        print("|---|---|---|---|---|---|---|---|")
        for k, r in result["sync"].items():
            os_s = r["object_store_put_get_s"]
            print(
                f"| {k} | {r['mib']:.1f} | {r['put_s']:.3f} s | {r['get_s']:.3f} s | {r['load_s']:.3f} s "
                f"| {r['checksum_s']:.3f} s | {r['shared_disk_total_s']:.3f} s | "
                f"{'-' if os_s is None else f'{os_s:.3f} s'} |"
            )


if __name__ == "__main__":
    main()
