"""Chaos soak: ``agentrl train --ray`` on a real local 2-node cluster while a seeded schedule kills its parts.

The cluster is started with the ``ray`` CLI, as docs/distributed.md describes: a head (``ray start --head``)
offering the ``learner`` and ``inference`` resources, and a second node (``ray start --address``) offering
``rollout`` and ``sandbox``, each with its own temp folder and ports. The driver is ``agentrl train --ray
ADDRESS`` itself (``trainers.cli.main``), with one substitution: the inference servers sample with the
scripted math-tir policy of the Ray tests (``tests/distributed/scripted.py``: it writes a python block, the
rollout worker runs it in the real bubblewrap sandbox, then it answers), because the tiny model never calls a
tool. The learner is the tiny model's real update; 2 rollout workers, 2 inference servers, a checkpoint per
step.

Once the first step has trained, a fault every ``--every`` seconds (± 25 %), for ``--minutes``; the kinds come
in seeded shuffled rounds of five, so each is injected as often as the others:

* ``rollout_worker``: SIGKILL a RolloutWorker actor process;
* ``inference_server``: SIGKILL an InferenceServer actor process (Ray restarts it);
* ``sandbox``: SIGKILL a sandbox process of a rollout worker (mid-call or idle in its pool);
* ``node``: SIGKILL every process of the rollout node (raylet, agents, actors, sandboxes), and ``ray start``
  it again ``--node-down-s`` later;
* ``driver``: SIGKILL the driver, and run the resume command (``agentrl train --resume RUN --ray ADDRESS``).

A driver that exits by itself (a crash) is restarted with the resume command too, and counted. After the
last fault the soak waits for two more steps, stops the driver with SIGTERM, then checks the invariants
(``benchmarks/chaos_check.py``: the ledger replayed record by record, every task of every step trained or
dropped with a reason, no trajectory duplicated or lost, no orphaned sandbox process or cgroup), and reports
faults injected and survived (two steps trained after the fault, with no crash in between), steps, the longest
stall between two trained steps, and the summed RSS and load average of the machine.

The cluster's processes are found by its own temp folders (and their descendants), never by name, so other
Ray instances on the machine are left alone; they are stopped the same way at the end.

    .venv/bin/python benchmarks/chaos.py                          # 30 minutes, a fault every 30 s
    .venv/bin/python benchmarks/chaos.py --minutes 3 --every 20 --json out.json --no-docs
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from chaos_cluster import Cluster, descendants, kill, proc_table, rss_bytes  # noqa: E402

ROOT = HERE.parent
DOCS = ROOT / "docs" / "benchmarks" / "chaos.md"
KINDS = ("rollout_worker", "inference_server", "sandbox", "node", "driver")
SANDBOX_MARK = b"import os,sys,marshal"  # the sandbox worker's bootstrap (sandbox/_protocol.py)
MB = 2**20


# ------------------------------------------------------------------------------------------------ driver
def train_args(run: Path, address: str, resume: bool) -> list[str]:
    """The ``agentrl train`` arguments of the soak's run (or of its resume)."""
    if resume:
        return ["train", "--resume", str(run), "--ray", address]
    return [
        "train",
        "--ray",
        address,
        "--model",
        "tiny",
        "--env",
        "math-tir-arith-v0",
        "--steps",
        "100000",  # the soak stops the driver with SIGTERM
        "--groups-per-step",
        "4",
        "--group-size",
        "2",
        "--rollout.max-turns",
        "3",
        "--rollout.max-new-tokens",
        "48",
        "--rollout.concurrency",
        "4",
        "--rollout.on-template-mismatch",
        "stop",
        "--rollout.seed",
        "7",
        "--lr",
        "1e-3",
        "--rollout-workers",
        "2",
        "--inference-servers",
        "2",
        "--checkpoint-every",
        "1",
        "--keep-checkpoints",
        "2",
        "--no-progress",
        "--out",
        str(run),
    ]


def drive(run: Path, address: str, resume: bool, generate_s: float, tool_s: float) -> int:
    """The driver process: ``agentrl train`` (the CLI's own entry point) with the scripted sampler."""
    sys.path.insert(0, str(ROOT))  # the repository root, for the test fake under tests/
    from agentrl.trainers import cli
    from agentrl.trainers import train as pg
    from agentrl.trainers.ray import RayOptions, ray_runtime
    from tests.distributed.scripted import ScriptedTIRFactory

    opts = RayOptions(policy_factory=ScriptedTIRFactory(generate_s=generate_s, tool_s=tool_s), lease_s=120)
    pg.open_runtime = lambda cfg, r: ray_runtime(cfg, r, opts)  # type: ignore[assignment]
    return cli.main(train_args(run, address, resume))


class Driver:
    """The ``agentrl train --ray`` driver process (this script with ``--drive``)."""

    def __init__(self, run: Path, address: str, log: Path, args: argparse.Namespace):
        self.run, self.address, self.log, self.args = run, address, log, args
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        resume = (self.run / "config.json").exists()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--drive", str(self.run), self.address]
        cmd += ["--generate-s", str(self.args.generate_s), "--tool-s", str(self.args.tool_s)]
        if resume:
            cmd.append("--resume")
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
        with self.log.open("ab") as sink:
            sink.write(f"\n=== {time.strftime('%H:%M:%S')} start {self.starts} resume={resume}\n".encode())
            sink.flush()
            self.proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.starts += 1

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 120.0) -> int | None:
        """SIGTERM (the trainer saves a checkpoint and exits 130), SIGKILL after ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# ------------------------------------------------------------------------------------------------ the soak
def schedule(
    rng: random.Random, seconds: float, every: float, kinds_used: tuple[str, ...] = KINDS
) -> list[tuple[float, str]]:
    """Fault times (seconds after the first trained step) and kinds: seeded shuffled rounds of ``kinds_used``
    (all five by default)."""
    out: list[tuple[float, str]] = []
    t, kinds = 0.0, []
    while True:
        t += every * rng.uniform(0.75, 1.25)
        if t > seconds:
            return out
        if not kinds:
            kinds = list(kinds_used)
            rng.shuffle(kinds)
        out.append((round(t, 1), kinds.pop()))


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work = args, work
        self.run = work / "run"
        self.cluster = Cluster()
        self.driver = Driver(self.run, self.cluster.address, work / "driver.log", args)
        self.t0 = time.monotonic()
        self.progress: list[tuple[float, int]] = []  # (time, step) each time a step's metrics row appeared
        self._rows_seen: set[str] = set()
        """Metrics lines seen (a resume truncates the file and writes the redone steps' rows anew)."""
        self.faults: list[dict[str, Any]] = []
        self.crashes: list[dict[str, Any]] = []
        self.worker_pids: set[int] = set()
        self.rss_max = 0
        self.loads: list[float] = []
        self.node_due: float | None = None
        self.node_start_failures = 0
        self.driver_due: float | None = None
        self._killed_driver = False
        self.stopping = False
        self._last_sample = 0.0
        self.timing: dict[str, Any] = {
            "load0": os.getloadavg(),
            "first_step_s": float("nan"),
            "driver_rc": None,
        }

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- watching --------------------------------------------------------------------------------
    def tick(self) -> None:
        """One poll: new steps, processes, RSS, the node or driver to bring back, a crashed driver."""
        path = self.run / "metrics.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                if line in self._rows_seen:
                    continue
                try:
                    step = int(json.loads(line)["step"])
                except (ValueError, KeyError):
                    continue  # a line still being written
                self._rows_seen.add(line)
                self.progress.append((self.now(), step))
        if self.now() - self._last_sample >= 2.0:
            self._last_sample = self.now()
            table = proc_table()
            self.worker_pids.update(self.cluster.actors(table, "RolloutWorker"))
            ours = self.cluster.processes(table)
            if self.driver.proc is not None and self.driver.exited() is None:
                ours |= descendants(table, {self.driver.proc.pid})
            self.rss_max = max(self.rss_max, rss_bytes(ours))
            self.loads.append(os.getloadavg()[0])
        if self.node_due is not None and self.now() >= self.node_due:
            self.node_due = None
            try:
                self.cluster.start_node()
            except RuntimeError as e:  # e.g. "timed out during startup" on a loaded machine: try again
                self.node_start_failures += 1
                print(
                    f"[{self.now():7.1f}s] node restart failed ({self.node_start_failures}): "
                    f"{str(e).strip().splitlines()[-1][:160]}",
                    flush=True,
                )
                if self.node_start_failures > 5:
                    raise
                self.node_due = self.now() + 5.0
        rc = self.driver.exited()
        if rc is not None and self.driver_due is None and not self.stopping:
            if not self._killed_driver:
                tail = self.driver.log.read_bytes()[-3000:].decode(errors="replace")
                self.crashes.append({"t": round(self.now(), 1), "rc": rc, "log_tail": tail})
                print(f"[{self.now():7.1f}s] driver exited by itself (rc {rc}); resuming", flush=True)
                if len(self.crashes) > self.args.max_crashes:
                    raise RuntimeError(f"the driver crashed {len(self.crashes)} times; last log:\n{tail}")
            self._killed_driver = False
            self.driver_due = self.now() + 2.0
        if self.driver_due is not None and self.now() >= self.driver_due:
            self.driver_due = None
            self.driver.start()

    def wait_until(self, t: float) -> None:
        while self.now() < t:
            self.tick()
            time.sleep(0.25)

    def steps_done(self) -> int:
        return len(self.progress)

    # -- faults ----------------------------------------------------------------------------------
    def inject(self, kind: str, rng: random.Random) -> dict[str, Any]:
        """One fault; retried for up to ``--every`` seconds (30 at most) while its kind has no target (the
        actors are still starting after a driver restart), then recorded as skipped."""
        give_up = self.now() + min(self.args.every, 30.0)
        while True:
            target = self._inject(kind, rng)
            if target or self.now() > give_up:
                break
            self.wait_until(self.now() + 0.5)
        # Floored, not rounded: a fault's time rounded up past a step row seen a few ms after the fault let
        # the tail (which counts rows after the fault by number) and summarize (by time) disagree, and the
        # soak failed with "1 of 9 faults not survived" (2026-11-28 12:29 UTC, .ci/run's experiment tier).
        t = math.floor(self.now() * 10) / 10
        rec = {"t": t, "kind": kind, "target": target, "steps_before": self.steps_done()}
        print(f"[{rec['t']:7.1f}s] fault {kind}: {target or 'no target (skipped)'}", flush=True)
        return rec

    def _inject(self, kind: str, rng: random.Random) -> str:
        table = proc_table()
        self.worker_pids.update(self.cluster.actors(table, "RolloutWorker"))  # their cgroups are checked
        if kind == "driver":
            if self.driver.exited() is not None or self.driver.proc is None:
                return ""
            self._killed_driver = True
            pid = self.driver.proc.pid
            self.driver.kill()
            return f"driver pid {pid}"
        if kind == "node":
            if self.node_due is not None:
                return ""
            n = self.cluster.kill_node()
            self.node_due = self.now() + self.args.node_down_s
            return f"rollout node ({n} processes)"
        if kind in ("rollout_worker", "inference_server"):
            pids = self.cluster.actors(
                table, "RolloutWorker" if kind == "rollout_worker" else "InferenceServer"
            )
            if not pids:
                return ""
            pid = rng.choice(pids)
            kill([pid])
            return f"{table[pid][1][:40].decode(errors='replace').strip()} pid {pid}"
        workers = set(self.cluster.actors(table, "RolloutWorker"))
        below = descendants(table, workers) - workers
        boxes = sorted(p for p in below if SANDBOX_MARK in table[p][1])
        if not boxes:
            return ""
        pid = rng.choice(boxes)
        kill([pid])
        return f"sandbox worker pid {pid}"

    # -- the run ---------------------------------------------------------------------------------
    def go(self) -> None:
        """Start the cluster and the driver, inject the schedule's faults, stop the driver."""
        args = self.args
        rng = random.Random(args.seed)
        plan = schedule(rng, args.minutes * 60, args.every, tuple(args.kinds.split(",")))
        self.timing["load0"] = os.getloadavg()
        self.cluster.start_head()
        self.cluster.start_node()
        self.driver.start()
        setup_deadline = self.now() + args.setup_timeout
        while not self.progress:
            if self.now() > setup_deadline:
                raise RuntimeError("no step trained within --setup-timeout: " + self._log_tail())
            self.wait_until(self.now() + 0.5)
        first = self.timing["first_step_s"] = self.now()
        print(f"[{first:7.1f}s] first step trained; {len(plan)} faults over {args.minutes} min", flush=True)
        for offset, kind in plan:
            self.wait_until(first + offset)
            self.faults.append(self.inject(kind, rng))
        # Two more steps after the last fault (the first may have been in flight when it hit; see summarize),
        # or the tail timeout, then stop the driver cleanly.
        end_faults = self.now()
        before = self.steps_done()
        while self.steps_done() < before + 2 and self.now() < end_faults + args.tail_timeout:
            self.wait_until(self.now() + 0.5)
        while self.driver_due is not None or self.node_due is not None:
            self.wait_until(self.now() + 0.5)
        self.stopping = True
        self.timing["driver_rc"] = self.driver.stop()
        self.tick()

    def _log_tail(self) -> str:
        return (
            self.driver.log.read_bytes()[-3000:].decode(errors="replace") if self.driver.log.exists() else ""
        )

    def close(self) -> None:
        self.driver.kill()
        self.cluster.stop()


def summarize(
    soak: Soak, timing: dict[str, Any], checks: dict[str, Any], left: dict[str, Any]
) -> dict[str, Any]:
    """The JSON result."""
    args = soak.args
    times = [t for t, _ in soak.progress]
    stalls = [b - a for a, b in itertools.pairwise(times)]
    crash_times = [c["t"] for c in soak.crashes]
    by_kind: dict[str, dict[str, int]] = {k: {"injected": 0, "survived": 0, "skipped": 0} for k in KINDS}
    for f in soak.faults:
        if not f["target"]:
            by_kind[f["kind"]]["skipped"] += 1
            f["survived"] = None
            continue
        by_kind[f["kind"]]["injected"] += 1
        # Survived: two step rows seen after the fault, with no crash before the second. The first row seen
        # after it may have been written just before it (rows are polled), so only the second is certainly a
        # step trained after the fault (a single row read a few ms after a fault at t=232.6 once failed the
        # 3-minute soak, 2026-11-28).
        after = [t for t in times if t > f["t"]]
        crashed = any(f["t"] < c <= (after[1] if len(after) > 1 else float("inf")) for c in crash_times)
        f["survived"] = len(after) > 1 and not crashed
        by_kind[f["kind"]]["survived"] += f["survived"]
    injected = sum(v["injected"] for v in by_kind.values())
    survived = sum(v["survived"] for v in by_kind.values())
    problems = list(checks["problems"])
    if left["processes"]:
        problems.append(f"orphans left: {len(left['processes'])} sandbox processes")
    # A killed worker's groups are reaped by the next pool start or worker close on its machine
    # (agentrl.sandbox._reaper), so any folder left is a failure too.
    if left["cgroups"]:
        problems.append(f"orphans left: {len(left['cgroups'])} cgroup folders of dead rollout workers")
    if soak.crashes:
        problems.append(f"the driver crashed {len(soak.crashes)} times")
    if survived < injected:
        problems.append(f"{injected - survived} of {injected} faults not survived")
    load1 = os.getloadavg()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "settings": {
            "minutes": args.minutes,
            "every_s": args.every,
            "seed": args.seed,
            "node_down_s": args.node_down_s,
            "generate_s": args.generate_s,
            "tool_s": args.tool_s,
        },
        "load": {
            "start_1min": round(timing["load0"][0], 1),
            "end_1min": round(load1[0], 1),
            "mean_1min": round(sum(soak.loads) / max(len(soak.loads), 1), 1),
            "max_1min": round(max(soak.loads, default=0.0), 1),
        },
        "faults": {"injected": injected, "survived": survived, "by_kind": by_kind},
        "driver": {
            "starts": soak.driver.starts,
            "crashes": len(soak.crashes),
            "final_rc": timing["driver_rc"],
        },
        "wall_s": round(timing["end_s"], 1),
        "first_step_s": round(timing["first_step_s"], 1),
        "step_rows": len(times),
        "longest_stall_s": round(max(stalls, default=0.0), 1),
        "rss_max_gib": round(soak.rss_max / 2**30, 2),
        **{k: v for k, v in checks.items() if k != "problems"},
        "orphans": {k: len(v) for k, v in left.items()},
        "orphan_examples": {k: v[:5] for k, v in left.items() if v},
        "problems": problems,
        "ok": not problems,
        "fault_log": soak.faults,
        "crash_logs": soak.crashes,
    }


def _no_run() -> dict[str, Any]:
    keys = ("steps", "groups_trained", "groups_dropped", "groups_in_flight_at_stop", "trajectories")
    keys += ("torn_lines", "lost", "duplicated", "ledger_records", "ledger_violations")
    return {k: 0 for k in keys} | {
        "dropped_reasons": {},
        "ledger_moves": {},
        "problems": ["no run directory"],
    }


def markdown(res: dict[str, Any]) -> str:
    s, f, load = res["settings"], res["faults"], res["load"]
    rows = [f"| {k} | {v['injected']} | {v['survived']} | {v['skipped']} |" for k, v in f["by_kind"].items()]
    return "\n".join(
        [
            "# Chaos soak of the Ray runtime",
            "",
            "`benchmarks/chaos.py`: `agentrl train --ray` on a real local 2-node "
            "cluster (`ray start --head`:",
            "learner + 2 inference servers; `ray start --address`: 2 rollout "
            "workers with bubblewrap sandboxes),",
            "the tiny model's real update, the scripted math-tir sampler (a "
            "python call in the sandbox, then the",
            "answer), 4 groups x 2 episodes per step, a checkpoint per step. A "
            "seeded schedule kills a rollout",
            "worker, an inference server, a sandbox process, the whole rollout node (restarted",
            f"{s['node_down_s']:g} s later) or the driver (resumed) every {s['every_s']:g} s (± 25 %) for",
            f"{s['minutes']:g} min (seed {s['seed']}); then the invariants are "
            "checked from the run directory.",
            "",
            f"Run {res['date']}; {res['machine']}; 1-minute load average {load['start_1min']} at the start,",
            f"{load['mean_1min']} on average and {load['max_1min']} at most during "
            f"the run, {load['end_1min']} at",
            "the end: a machine shared with other engineers' jobs, so these are numbers under load.",
            "",
            "| fault | injected | survived | skipped (no target at the time) |",
            "|---|---:|---:|---:|",
            *rows,
            f"| **all** | **{f['injected']}** | **{f['survived']}** | |",
            "",
            "| steps trained | trajectories | lost | duplicated | groups trained / dropped | ledger records "
            "| ledger violations | longest stall | driver starts / crashes | orphans (processes, cgroups) "
            "| peak RSS (cluster + driver) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {res['steps']} | {res['trajectories']} | **{res['lost']}** | **{res['duplicated']}** | "
            f"{res['groups_trained']} / {res['groups_dropped']} | {res['ledger_records']} | "
            f"{res['ledger_violations']} | {res['longest_stall_s']:.0f} s | {res['driver']['starts']} / "
            f"{res['driver']['crashes']} | {res['orphans']['processes']}, {res['orphans']['cgroups']} | "
            f"{res['rss_max_gib']:.2f} GiB |",
            "",
            "Orphans are counted after the reap the next pool start on the node would run (agentrl.sandbox."
            f"_reaper); before it the run had left {res.get('orphans_before_reap', {}).get('cgroups', 0)} "
            f"cgroup folders of killed workers, and it removed {res.get('reaped', {}).get('removed', 0)}.",
            f"Dropped groups by reason: {res['dropped_reasons'] or 'none'}. Ledger moves that only faults"
            f" cause: {res['ledger_moves']}. The first step trained {res['first_step_s']:.0f} s after the",
            f"start (cluster start, actors importing torch); wall time {res['wall_s'] / 60:.1f} min. Verdict:"
            f" {'every invariant held' if res['ok'] else 'PROBLEMS: ' + '; '.join(res['problems'])}.",
            "",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0, help="how long faults are injected")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between faults (± 25 %%)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    ap.add_argument("--kinds", default=",".join(KINDS), help="the fault kinds to inject, comma-separated")
    ap.add_argument("--node-down-s", type=float, default=10.0, help="seconds a killed node stays down")
    ap.add_argument("--generate-s", type=float, default=0.3, help="the scripted sampler's sleep per turn")
    ap.add_argument("--tool-s", type=float, default=0.2, help="sleep inside each sandboxed python call")
    ap.add_argument("--setup-timeout", type=float, default=600.0, help="seconds to the first trained step")
    ap.add_argument("--tail-timeout", type=float, default=300.0, help="seconds to wait for a step at the end")
    ap.add_argument("--max-crashes", type=int, default=5, help="driver crashes before the soak gives up")
    ap.add_argument("--workdir", default=None, help="folder for the run and logs (default: a temp folder)")
    ap.add_argument("--json", default=None, help="write the JSON result here")
    ap.add_argument("--no-docs", action="store_true", help=f"do not write {DOCS.relative_to(ROOT)}")
    ap.add_argument("--drive", nargs=2, metavar=("RUN", "ADDRESS"), help=argparse.SUPPRESS)
    ap.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if bad := set(args.kinds.split(",")) - set(KINDS):
        ap.error(f"--kinds: unknown fault kinds {sorted(bad)} (known: {', '.join(KINDS)})")
    if args.drive:
        sys.exit(drive(Path(args.drive[0]), args.drive[1], args.resume, args.generate_s, args.tool_s))
    sys.path.insert(0, str(HERE))
    from chaos_check import check_run, orphans

    work = Path(args.workdir or tempfile.mkdtemp(prefix="agentrl-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    soak = Soak(args, work)
    print(f"chaos soak: work folder {work}, cluster {soak.cluster.address}", flush=True)
    error = ""
    try:
        soak.go()
    except Exception as e:  # reported with whatever the run left (the invariants are checked all the same)
        error = f"the soak failed: {type(e).__name__}: {e}"
    finally:
        soak.close()
    soak.timing["end_s"] = soak.now()
    time.sleep(2.0)  # let the kernel finish tearing down the killed sandboxes' cgroups
    checks = check_run(soak.run) if (soak.run / "config.json").exists() else _no_run()
    # A worker killed after the last pool start or worker close on its node (the final faults, the cluster's
    # stop) leaves its cgroup folders until the next agentrl process there starts a pool, which reaps them.
    # That reap is run here, as the next run's first pool would: the invariant is that it leaves nothing.
    left_by_run = orphans(soak.worker_pids)
    from agentrl.sandbox._reaper import reap_cgroups

    reap = reap_cgroups()
    res = summarize(soak, soak.timing, checks, orphans(soak.worker_pids))
    res["orphans_before_reap"] = {k: len(v) for k, v in left_by_run.items()}
    kept = [list(k) for k in reap.kept]
    res["reaped"] = {"removed": len(reap.removed), "killed": len(reap.killed), "kept": kept}
    if reap.kept:
        res["problems"].append(
            f"the reaper kept {len(reap.kept)} dead workers' cgroup folders: {reap.kept[:3]}"
        )
        res["ok"] = False
    if error:
        res["problems"].insert(0, error)
        res["ok"] = False
    text = json.dumps(res, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    print(text)
    print(markdown(res))
    if not args.no_docs:
        DOCS.write_text(markdown(res))
    sys.exit(0 if res["ok"] else 1)


if __name__ == "__main__":
    main()
