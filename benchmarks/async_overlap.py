"""Asynchronous overlap: wall time per training step with --max-staleness S = 0, 1, 2, side by side.

The real trainer (``agentrl.trainers.train.train``: the one loop of ``trainers/loop.py``, in lock step at
S = 0, overlapped at S >= 1) with sleep-bound generation and a learner step of similar duration,
both configurable, on two runtimes:

* ``ray`` (the issue's setting): a real local Ray cluster started with ``ray start`` (a head offering the
  learner and inference resources, a second node the rollout and sandbox resources), the scripted math-tir
  sampler on the inference server sleeping ``--gen-s`` per model turn (two-turn episodes: a python call in
  the real sandbox, then the answer), the tiny model's real update on the learner actor plus
  ``--learn-sleep-s`` of sleep (a harness subclass of the learner actor);
* ``local``: one process, ``agentrl.testing.ScriptedPolicy`` sleeping ``--gen-s`` per turn (one-turn
  episodes of ``guess-number-v0``) and the tiny model's update plus the same sleep inside ``Learner.step``.

Measured per S: wall time per step (steps after the first, which pays for warm-up), the learner's idle
fraction (time waiting for data / step time), the largest staleness trained on. The target (issue 13):
S = 1 at least 1.6x the throughput of S = 0 when generation ≈ learning (ceiling 2x). The last line reports
the Ray runtime's S = 1 ratio (the local one's when only ``--runtime local`` ran).

    .venv/bin/python benchmarks/async_overlap.py            # both runtimes; writes docs/benchmarks/async.md
    .venv/bin/python benchmarks/async_overlap.py --runtime ray --quick --no-docs
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "async.md"


def run_one(S: int, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """The local runtime, one process."""
    import functools

    import agentrl.trainers.local as local
    from agentrl.learner import Learner, LearnerConfig
    from agentrl.models import smollm2_tokenizer
    from agentrl.rollout import RolloutConfig
    from agentrl.testing import RecordingWeightSink, ScriptedPolicy
    from agentrl.trainers import train

    sleep_s = args.learn_sleep_s

    class SleepyLearner(Learner):
        """The real learner, with a sleep added to every step (the harness's stand-in for a bigger model)."""

        def step(self, *a: Any, **kw: Any) -> Any:
            time.sleep(sleep_s)
            return super().step(*a, **kw)

    tok = smollm2_tokenizer()
    stop = tok.convert_tokens_to_ids("<|im_end|>")

    def turn(prompt_ids: Any, sampling: Any) -> list[int]:
        guess = 1 + int(hashlib.sha256(str(sampling.seed).encode()).hexdigest(), 16) % 3
        return [*tok.encode(str(guess), add_special_tokens=False), stop]

    sink = RecordingWeightSink(ScriptedPolicy(turn, with_sampling=True, stop_ids=[stop], delay_s=args.gen_s))
    cfg = train.TrainConfig(
        model="tiny",
        env="guess-number-v0",
        env_kwargs={"low": 1, "high": 3, "max_guesses": 1},
        group_size=args.group_size,
        groups_per_step=args.groups,
        steps=args.steps,
        out=str(out / f"s{S}"),
        progress=False,
        max_staleness=S,
        rollout=RolloutConfig(max_turns=1, max_new_tokens=8, max_total_tokens=256, seed=1, concurrency=64),
        learner=LearnerConfig(lr=1e-3),
        checkpoint_every=10_000,  # only the last step writes one: the benchmark times the loop
    )
    original = local.Learner
    local.Learner = SleepyLearner  # type: ignore[misc]
    try:
        t0 = time.perf_counter()
        asyncio.run(train.train(cfg, runtime=functools.partial(local.local_runtime, sampler=sink)))
        total = time.perf_counter() - t0
    finally:
        local.Learner = original  # type: ignore[misc]
    return summarize(cfg.out, total)


def summarize(run: str | Path, total: float) -> dict[str, float]:
    """Means over steps 1.. of a run's metrics (step 0 pays for warm-up)."""
    from agentrl.metrics import read_metrics

    rows = read_metrics(run)[1:]
    idle = [r.get("async/learner_idle_frac", r["time/rollout_s"] / r["time/step_s"]) for r in rows]
    return {
        "step_s": statistics.mean(r["time/step_s"] for r in rows),
        "rollout_wait_s": statistics.mean(r["time/rollout_s"] for r in rows),
        "learn_s": statistics.mean(r["time/learn_s"] for r in rows),
        "publish_s": statistics.mean(r["time/publish_s"] for r in rows),
        "idle": statistics.mean(idle),
        "staleness": max(r.get("staleness/max", 0.0) for r in read_metrics(run)),
        "total_s": total,
    }


class RayCluster:
    """A real local Ray cluster, started with the ``ray`` CLI: a head with the learner and inference
    resources, a second node with the rollout and sandbox resources. Stopping kills only its own
    processes (found by its temp folder)."""

    def __init__(self) -> None:
        import json
        import subprocess

        self.temp_dir = tempfile.mkdtemp(prefix="agentrl-bench-ray-", dir="/tmp")
        port = 27379 + os.getpid() % 1000
        self.address = f"127.0.0.1:{port}"
        ray_bin = str(Path(sys.executable).parent / "ray")
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        common = ["--num-cpus", "1", "--disable-usage-stats"]
        for args in (
            [
                "--head",
                f"--port={port}",
                f"--temp-dir={self.temp_dir}",
                "--include-dashboard=false",
                "--resources",
                json.dumps({"learner": 1, "inference": 1}),
            ],
            [
                f"--address={self.address}",
                "--resources",
                json.dumps({"rollout": 2, "sandbox": 2}),
                "--node-manager-port=0",
                "--object-manager-port=0",
            ],
        ):
            out = subprocess.run([ray_bin, "start", *args, *common], capture_output=True, text=True, env=env)
            if out.returncode != 0:
                self.stop()
                raise RuntimeError(f"ray start {args[0]} failed: {out.stderr[-2000:]}")

    def stop(self) -> None:
        import signal

        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if self.temp_dir in cmd:
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def run_one_ray(S: int, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """The Ray runtime on the running cluster (``ray.init`` already called)."""
    from agentrl.learner import LearnerConfig
    from agentrl.rollout import RolloutConfig
    from agentrl.trainers import train
    from agentrl.trainers.ray import RayOptions, ray_runtime
    from agentrl.trainers.ray.learner import LearnerActor
    from agentrl.trainers.train_setup import DeployConfig

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/
    from tests.distributed.scripted import ScriptedTIRFactory  # a test fake, not shipped

    sleep_s = args.learn_sleep_s

    class SleepyLearnerActor(LearnerActor):
        """The real learner actor, with a sleep added to every update (a stand-in for a bigger model)."""

        def update(self, step: int, groups: Any) -> dict[str, float]:
            time.sleep(sleep_s)
            return super().update(step, groups)

    cfg = train.TrainConfig(
        model="tiny",
        env="math-tir-arith-v0",
        group_size=args.group_size,
        groups_per_step=args.groups,
        steps=args.steps,
        out=str(out / f"ray-s{S}"),
        progress=False,
        max_staleness=S,
        rollout=RolloutConfig(
            max_turns=3,
            max_new_tokens=48,
            concurrency=args.groups * args.group_size,
            seed=1,
            on_template_mismatch="stop",
        ),
        learner=LearnerConfig(lr=1e-3),
        checkpoint_every=10_000,
        deploy=DeployConfig(ray="auto", rollout_workers=2),
    )
    opts = RayOptions(
        policy_factory=ScriptedTIRFactory(generate_s=args.gen_s), learner_actor=SleepyLearnerActor
    )
    t0 = time.perf_counter()
    asyncio.run(train.train(cfg, runtime=lambda c, r: ray_runtime(c, r, opts)))
    return summarize(cfg.out, time.perf_counter() - t0)


def table(res: dict[int, dict[str, float]]) -> list[str]:
    speed = {S: res[0]["step_s"] / res[S]["step_s"] for S in res}
    lines = [
        "| S | wall s / step | learner waits for data, s / step | learn s / step (of which weight sync) | "
        "learner idle | max staleness | throughput vs S = 0 |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for S, r in res.items():
        lines.append(
            f"| {S} | {r['step_s']:.2f} | {r['rollout_wait_s']:.2f} | "
            f"{r['learn_s']:.2f} ({r['publish_s']:.2f}) | {r['idle']:.0%} | "
            f"{r['staleness']:.0f} | {speed[S]:.2f}x |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=("ray", "local", "both"), default="both")
    ap.add_argument("--gen-s", type=float, default=None, help="sleep per model turn (generation)")
    ap.add_argument("--learn-sleep-s", type=float, default=None, help="sleep added to each learner step")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--groups", type=int, default=2, help="groups per step")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="4 steps, shorter sleeps")
    ap.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks/async.md")
    args = ap.parse_args()
    if args.quick:
        args.steps = 4
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # Sleeps per runtime: a Ray episode has two model turns and a sandbox call, a local one one turn.
    defaults = {"ray": (0.5, 0.3), "local": (1.0, 0.7)}
    if args.quick:
        defaults = {"ray": (0.4, 0.2), "local": (0.5, 0.3)}
    runtimes = ("ray", "local") if args.runtime == "both" else (args.runtime,)
    results: dict[str, tuple[dict[int, dict[str, float]], float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rt in runtimes:
            gen_s = args.gen_s if args.gen_s is not None else defaults[rt][0]
            learn_s = args.learn_sleep_s if args.learn_sleep_s is not None else defaults[rt][1]
            run_args = argparse.Namespace(**{**vars(args), "gen_s": gen_s, "learn_sleep_s": learn_s})
            res: dict[int, dict[str, float]] = {}
            if rt == "ray":
                import ray

                cluster = RayCluster()
                try:
                    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
                    for S in (0, 1, 2):
                        res[S] = run_one_ray(S, run_args, Path(tmp))
                        print(f"ray S={S}: {res[S]}", file=sys.stderr)
                finally:
                    ray.shutdown()
                    cluster.stop()
            else:
                for S in (0, 1, 2):
                    res[S] = run_one(S, run_args, Path(tmp))
                    print(f"local S={S}: {res[S]}", file=sys.stderr)
            results[rt] = (res, gen_s, learn_s)
    load = os.getloadavg()[0]
    lines = [
        "# Asynchronous overlap",
        "",
        "`benchmarks/async_overlap.py`: the real trainer (the one loop of `trainers/loop.py`: lock step at",
        "S = 0, overlapped for S >= 1) with sleep-bound generation and a learner step of",
        "similar duration. Means over steps 1.. (step 0 warms up).",
        "Target (issue 13): S = 1 >= 1.6x the throughput of S = 0 (ceiling 2x).",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"1-minute load average {load:.1f} at the end (other jobs may share the machine). "
        f"{args.groups} groups x {args.group_size} episodes per step, {args.steps} steps.",
    ]
    if "ray" in results:
        res, gen_s, learn_s = results["ray"]
        lines += [
            "",
            "## Ray runtime, real local cluster",
            "",
            "`ray start --head` (learner + inference resources) and a second `ray start --address` node",
            "(rollout + sandbox resources, 2 rollout workers); the scripted math-tir sampler on the",
            f"inference server sleeps {gen_s} s per model turn (episodes: a python call in the real",
            f"sandbox, then the answer); the learner actor runs the tiny model's real update plus "
            f"{learn_s} s of sleep.",
            "",
            *table(res),
        ]
    if "local" in results:
        res, gen_s, learn_s = results["local"]
        lines += [
            "",
            "## Local runtime, one process",
            "",
            f"`ScriptedPolicy` sleeping {gen_s} s per turn (one-turn `guess-number-v0` episodes); the tiny",
            f"model's real update plus {learn_s} s of sleep in `Learner.step`.",
            "",
            *table(res),
        ]
    lines += [
        "",
        "At S = 0 the learner idles for the whole rollout and generation idles for the whole update; at",
        "S = 1 the next step's episodes run during the update, so a step costs about max(generation,",
        "learning) instead of their sum. S = 2 adds nothing when the two are equal (the bound is not what",
        "limits throughput), it only allows older data. Ratios a little above the ceiling come from the",
        "learner's time varying between runs (the sleeps are exact, the real update on 2 shared cores is",
        "not). On Ray the weight sync (learner publish, every server loads and checksums) is part of the",
        "learner's step.",
    ]
    if not args.no_docs:
        DOCS.parent.mkdir(parents=True, exist_ok=True)
        DOCS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    res = results["ray" if "ray" in results else "local"][0]
    print(f"async overlap S=1: {res[0]['step_s'] / res[1]['step_s']:.2f}x")


if __name__ == "__main__":
    main()
