"""Rollout scale-out on Ray: episodes per second with 1, 2 and 4 rollout workers; the controller's cost.

Usage::

    .venv/bin/python benchmarks/scale.py          # writes docs/benchmarks/scale.md; last line: the ratio

Each configuration starts the Ray runtime of ``agentrl train --ray local`` (learner, one inference server,
N rollout workers with their sandbox pools) on one local Ray instance, runs one warm-up step (sandbox pools
start, processes import), then times one step of ``groups`` groups through the controller
(:meth:`RayRuntime.run_groups`: leases, results, ledger). The sampler is the scripted math-tir policy whose
turns sleep ``--generate-s`` and whose python block sleeps ``--tool-s`` inside the real sandbox, so the work
is sleep-bound and a worker's throughput is set by its episode concurrency, as with a GPU-served model.
Controller overhead per episode = the driver process's CPU time during the timed step / episodes.
Target (issue 12): ≥ 1.8x episodes/s with 2 workers vs 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from agentrl.rollout import RolloutConfig
from agentrl.run import RunDir
from agentrl.trainers import train_setup
from agentrl.trainers.ray import RayOptions, ray_runtime
from agentrl.types import TrajectoryMeta

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/
from tests.distributed.scripted import ScriptedTIRFactory


async def measure(workers: int, args: argparse.Namespace, root: Path) -> dict[str, float]:
    """Episodes/s and controller CPU per episode with ``workers`` rollout workers."""
    cfg = train_setup.TrainConfig(
        model="tiny",
        env="math-tir-arith-v0",
        group_size=args.group_size,
        groups_per_step=args.groups,
        steps=2,
        out=str(root / f"w{workers}"),
        rollout=RolloutConfig(
            max_turns=3,
            max_new_tokens=64,
            concurrency=args.concurrency,
            on_template_mismatch="stop",
            seed=1,
        ),
        progress=False,
        deploy=train_setup.DeployConfig(ray="local", rollout_workers=workers),
    )
    cfg, run = train_setup.prepare_run(cfg)
    opts = RayOptions(policy_factory=ScriptedTIRFactory(generate_s=args.generate_s, tool_s=args.tool_s))
    out: dict[str, float] = {}
    async with ray_runtime(cfg, RunDir(run.path), opts) as rt:
        for step in (0, 1):
            seeds = train_setup.task_seeds(cfg.seed, step, cfg.groups_per_step)
            meta = TrajectoryMeta(env_id=cfg.env, step=step, policy_version=rt.version)
            t0, c0 = time.perf_counter(), time.process_time()
            n = infra = 0
            async for done in rt.run_groups(seeds=seeds, group_size=cfg.group_size, meta=meta):
                n += 1
                infra += done.trajectory.infra_failure
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if step == 1:
                out = {"episodes": n, "wall_s": wall, "eps": n / wall, "ctrl_ms": 1000 * cpu / n}
                out["infra"] = infra
        rt.ledger.mark_trained([k for k, e in rt.ledger.entries.items() if e.state.value == "done"])
        rt.ledger.check(settled=True)
    return out


async def run(args: argparse.Namespace) -> list[str]:
    import ray

    ray.init(
        num_cpus=2,
        resources={"rollout": 5, "sandbox": 5, "inference": 1, "learner": 1},
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=200 * 2**20,
    )
    results = {}
    try:
        with tempfile.TemporaryDirectory(prefix="agentrl-scale-") as tmp:
            for w in args.workers:
                results[w] = await measure(w, args, Path(tmp))
                r = results[w]
                print(f"{w} workers: {r['eps']:.2f} episodes/s ({r['episodes']:.0f} in {r['wall_s']:.1f}s)")
    finally:
        ray.shutdown()
    base = results[args.workers[0]]["eps"]
    load = os.getloadavg()[0]
    lines = [
        "# Rollout scale-out on Ray",
        "",
        "`benchmarks/scale.py`: the Ray runtime of `agentrl train --ray local` on one local Ray instance",
        f"(2 CPUs), one inference server, N rollout workers each running {args.concurrency} episodes at once",
        "with its own sandbox pool (the real bubblewrap sandbox). The sampler is the scripted math-tir",
        f"policy: each turn sleeps {args.generate_s} s, each python block sleeps {args.tool_s} s inside the",
        "sandbox (sleep-bound work, like a GPU-served model).",
        f"{args.groups} groups x {args.group_size} episodes per timed step, after one warm-up step.",
        "Controller overhead = the driver's CPU time (leasing, ledger, results) per episode.",
        "Target (issue 12): >= 1.8x at 2 workers.",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()};",
        f"1-minute load average {load:.1f} at the end of the run (the machine is shared with other jobs).",
        "",
        "| rollout workers | episodes/s | speed-up | controller CPU ms / episode | infra failures |",
        "|---:|---:|---:|---:|---:|",
    ]
    for w, r in results.items():
        lines.append(
            f"| {w} | {r['eps']:.2f} | {r['eps'] / base:.2f}x | {r['ctrl_ms']:.2f} | {r['infra']:.0f} |"
        )
    ratio = results[2]["eps"] / results[1]["eps"] if 1 in results and 2 in results else float("nan")
    lines += ["", f"scale-out 2 workers: {ratio:.2f}x", ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8, help="episodes in flight per worker")
    ap.add_argument("--generate-s", type=float, default=1.0)
    ap.add_argument("--tool-s", type=float, default=1.0)
    ap.add_argument("--out", default=str(Path(__file__).parent.parent / "docs/benchmarks/scale.md"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    lines = asyncio.run(run(args))
    Path(args.out).write_text("\n".join(lines))
    print(lines[-2])


if __name__ == "__main__":
    main()
