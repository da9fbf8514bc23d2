"""Where the default ``agentrl train`` step's resident memory goes, phase by phase.

Runs ``agentrl train --steps N`` (every default: SmolLM2-135M fp32, math-tir-arith-v0, OTB, 4 x 4 episodes) in
a child process with probes installed: the trainer's own functions are wrapped (nothing in the trainer is
edited) so that each phase — model load, rollout, learner scoring, learner forward / backward, gradient
clipping, optimizer step, checkpoint — is known, and a sampler thread reads the process's RSS every 20 ms. For
each phase
it reports RSS at entry, the peak inside it, and RSS at exit; at the phase ends it also reads glibc's
``mallinfo2`` (bytes in use on the malloc heaps vs held free in them, and in mmapped chunks), so heap
fragmentation shows up as RSS that is not in use. Persistent tensors (weights, gradients, AdamW state) are
counted from the live objects at the end.

Variants (``--variants``), each a fresh process: ``default``; ``arena2`` (``MALLOC_ARENA_MAX=2``); ``mmap``
(``MALLOC_MMAP_THRESHOLD_=1048576`` — fixed threshold, so every tensor of 1 MiB or more is its own mapping and
goes back to the OS when freed — plus ``MALLOC_TRIM_THRESHOLD_``); ``static`` (the old static-batch HFPolicy
from ``--baseline-ref``, to separate the generation path's share); ``notrim`` (the trainer without its
``malloc_trim`` between phases and the learner's micro-batches). Writes docs/benchmarks/memory.md.

    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/memory_profile.py [--variants default,mmap]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
VARIANT_ENV = {
    "default": {},
    "static": {},
    "arena2": {"MALLOC_ARENA_MAX": "2"},
    "mmap": {"MALLOC_MMAP_THRESHOLD_": str(2**20), "MALLOC_TRIM_THRESHOLD_": str(2**27)},
    "notrim": {},
}


def _mallinfo() -> dict[str, float]:
    from agentrl.heap import heap_info

    info = heap_info()
    return {} if info is None else {k: v / GIB for k, v in info.items()}


def _rss() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GIB


class Probe:
    """Phase stack + RSS sampler."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.persistent: dict[str, float] = {}
        self.events: list[dict[str, Any]] = []
        self.peaks: dict[str, float] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.t0 = time.perf_counter()
        threading.Thread(target=self._sample, daemon=True).start()

    @property
    def phase(self) -> str:
        return " / ".join(self.stack)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.note()

    def note(self) -> None:
        r = _rss()
        with self.lock:
            self.peaks["whole run"] = max(self.peaks.get("whole run", 0.0), r)
            for depth in range(1, len(self.stack) + 1):
                key = " / ".join(self.stack[:depth])
                self.peaks[key] = max(self.peaks.get(key, 0.0), r)

    def mark(self, what: str, name: str) -> None:
        self.note()
        self.events.append(
            {"t": time.perf_counter() - self.t0, "what": what, "phase": name, "rss": _rss(), **_mallinfo()}
        )

    def enter(self, name: str) -> None:
        with self.lock:
            self.stack.append(name)
        self.mark("enter", self.phase)

    def leave(self) -> None:
        self.mark("exit", self.phase)
        with self.lock:
            self.stack.pop()


PROBE: Probe | None = None


def _wrap(obj: Any, attr: str, name: str) -> None:
    """Wrap ``obj.attr`` (sync or async function) so its calls are phase ``name``; skip it if missing."""
    import inspect

    fn = getattr(obj, attr, None)
    if fn is None:
        print(f"memory_profile: {obj.__name__}.{attr} not found; phase {name!r} not probed", file=sys.stderr)
        return
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*a: Any, **k: Any) -> Any:
            assert PROBE is not None
            PROBE.enter(name)
            try:
                return await fn(*a, **k)
            finally:
                PROBE.leave()

        setattr(obj, attr, awrapper)
        return

    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        assert PROBE is not None
        PROBE.enter(name)
        try:
            return fn(*a, **k)
        finally:
            PROBE.leave()

    setattr(obj, attr, wrapper)


def _install(static_ref: str | None, trim: bool = True) -> None:
    global PROBE
    PROBE = Probe()
    import torch

    import agentrl.learner as learner_mod
    import agentrl.policies.hf as hf_mod
    import agentrl.trainers.factories as factories
    import agentrl.trainers.local as local

    if static_ref is not None:  # the old static-batch policy, to separate the generation path's share
        from generation import static_policy_class  # benchmarks/generation.py

        factories.HFPolicy = local.HFPolicy = hf_mod.HFPolicy = static_policy_class(static_ref)
    if not trim:  # the trainer as it was before it trimmed the heaps (between phases and micro-batches)
        import agentrl.learner.learner as learner_impl

        local.trim_heap = learner_impl.trim_heap = lambda: None
    # The local runtime (trainers/local.py) loads the model, learns, checkpoints and evaluates.
    _wrap(local, "resolve_model", "model load")
    _wrap(local, "policy_update", "learn")
    _wrap(local, "save_checkpoint", "checkpoint")
    _wrap(local, "run_held_out", "held-out eval")
    _wrap(learner_mod.Learner, "score", "score (no grad)")
    _wrap(learner_mod.Learner, "step", "policy step")
    _wrap(learner_mod.Learner, "_clip_grad", "grad clip")
    _wrap(learner_mod, "forward_logprobs", "forward")
    _wrap(torch.optim.AdamW, "step", "optimizer step")
    _wrap(torch.Tensor, "backward", "backward")

    # The rollout: from a step's first generate to its policy update.
    policy_cls = factories.HFPolicy
    gen = policy_cls.generate

    @functools.wraps(gen)
    async def generate(self: Any, *a: Any, **k: Any) -> Any:
        assert PROBE is not None
        if not PROBE.stack:  # inside "held-out eval" the generation belongs to the eval
            PROBE.enter("rollout")
        return await gen(self, *a, **k)

    policy_cls.generate = generate
    update = local.policy_update

    @functools.wraps(update)
    def policy_update(learner: Any, *a: Any, **k: Any) -> Any:
        assert PROBE is not None
        if PROBE.stack and PROBE.stack[-1] == "rollout":
            PROBE.leave()
        out = update(learner, *a, **k)
        PROBE.persistent = _persistent(learner)
        return out

    local.policy_update = policy_update


def _persistent(learner: Any) -> dict[str, float]:
    """GiB of parameters, gradients and optimizer state the learner holds after its update, and how many
    distinct model objects with their own weights are alive (policy, learner, reference)."""
    import gc

    import torch

    def nbytes(ts: Any) -> float:
        return sum(t.numel() * t.element_size() for t in ts) / GIB

    params = list(learner.model.parameters())
    state = [v for st in learner.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    storages = {
        p.untyped_storage().data_ptr()
        for m in gc.get_objects()
        if isinstance(m, torch.nn.Module) and hasattr(m, "lm_head")
        for p in m.parameters()
    }
    own = {p.untyped_storage().data_ptr() for p in params}
    return {
        "params": nbytes(params),
        "grads": nbytes(p.grad for p in params if p.grad is not None),
        "optimizer state": nbytes(state),
        "other model weights": float(len(storages - own)),
    }


def child(args: argparse.Namespace) -> None:
    _install(args.baseline_ref if args.variant == "static" else None, trim=args.variant != "notrim")
    from agentrl.trainers.cli import main as cli

    assert PROBE is not None
    code = 0
    try:
        argv = ["train", "--steps", str(args.steps), "--no-progress", "--out", str(args.run_dir)]
        code = cli([*argv, *args.train_args.split()])
    finally:
        PROBE.mark("end", "end")
        with open("/proc/self/status") as fh:
            hwm = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM")) / 2**20
        result = {
            "code": code,
            "peaks": PROBE.peaks,
            "events": PROBE.events,
            "vmhwm": hwm,
            "persistent": PROBE.persistent,
        }
        Path(args.result).write_text(json.dumps(result))


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        result = Path(d) / "result.json"
        env = {**os.environ, **VARIANT_ENV[variant]}
        cmd = [
            "/usr/bin/time",
            "-v",
            sys.executable,
            __file__,
            "--child",
            "--variant",
            variant,
            "--steps",
            str(args.steps),
            "--run-dir",
            str(Path(d) / "run"),
            "--result",
            str(result),
            "--baseline-ref",
            args.baseline_ref,
            f"--train-args={args.train_args}",
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not result.exists():
            raise RuntimeError(f"{variant} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        out = json.loads(result.read_text())
        maxrss = next(
            int(line.split(":")[1])
            for line in proc.stderr.splitlines()
            if "Maximum resident set size" in line
        )
        out["time_v_maxrss"] = maxrss / 2**20
        out["wall_s"] = wall
        out["stdout_tail"] = proc.stdout.strip().splitlines()[-2:]
        return out


def table(variant: str, r: dict[str, Any]) -> list[str]:
    ev: dict[tuple[str, str], dict[str, Any]] = {}
    calls: dict[str, int] = {}
    for e in r["events"]:  # first entry and last exit of each phase
        if e["what"] == "enter":
            ev.setdefault(("enter", e["phase"]), e)
            calls[e["phase"]] = calls.get(e["phase"], 0) + 1
        else:
            ev[(e["what"], e["phase"])] = e
    lines = [
        f"### `{variant}`",
        "",
        f"Peak RSS (`/usr/bin/time -v`): **{r['time_v_maxrss']:.2f} GiB**; wall {r['wall_s']:.0f} s; "
        f"{' | '.join(r['stdout_tail'])}",
        "",
        "| phase | RSS at entry | peak in phase | RSS at exit | malloc heap in use / free at exit "
        "| mmapped |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    order = sorted(
        r["peaks"],
        key=lambda p: (
            min(e["t"] for e in r["events"] if e["phase"] == p)
            if any(e["phase"] == p for e in r["events"])
            else -1.0
        ),
    )
    for phase in order:
        enter, leave = ev.get(("enter", phase)), ev.get(("exit", phase))
        ent = f"{enter['rss']:.2f}" if enter else "–"
        ext = f"{leave['rss']:.2f}" if leave else "–"
        heap = (
            f"{leave['heap_used']:.2f} / {leave['heap_free']:.2f}" if leave and "heap_used" in leave else "–"
        )
        mm = f"{leave['mmapped']:.2f}" if leave and "mmapped" in leave else "–"
        n = f" (x{calls[phase]})" if calls.get(phase, 1) > 1 else ""
        lines.append(f"| {phase}{n} | {ent} | {r['peaks'][phase]:.2f} | {ext} | {heap} | {mm} |")
    p = r["persistent"]
    lines += [
        "",
        f"Held after the update: parameters {p['params']:.2f} GiB (one model object, shared by the policy "
        f"and the learner; {p['other model weights']:.0f} parameter tensors of other models alive), "
        f"gradients {p['grads']:.2f} GiB (freed by `zero_grad(set_to_none=True)`), AdamW state "
        f"{p['optimizer state']:.2f} GiB. All numbers GiB.",
        "",
    ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="default", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--variants", default="default,static,mmap,arena2")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--train-args", default="", help="more `agentrl train` arguments (e.g. '--model tiny')")
    ap.add_argument("--baseline-ref", default="4be4b32", help="git ref of the static-batch HFPolicy")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "memory.md")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    load0 = os.getloadavg()[0]
    results = {}
    for v in args.variants.split(","):
        results[v] = run_variant(v, args)
        print(v, results[v]["time_v_maxrss"], flush=True)
    lines = [
        "# Memory of the default `agentrl train` step, per phase",
        "",
        f"Run: `python benchmarks/memory_profile.py --steps {args.steps} --variants {args.variants}` on "
        f"{platform.machine()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}; load average at start "
        f"{load0:.1f}. Each variant is a fresh `agentrl train --steps {args.steps}` process with every "
        "default; RSS sampled every 20 ms, in GiB.",
        "",
    ]
    for v, r in results.items():
        lines += table(v, r)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
