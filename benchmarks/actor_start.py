"""What a Ray rollout worker pays before its first episode, side by side in one run (issue 41).

A rollout worker unpickles the run's TrainConfig, takes the run's tokenizer, builds its renderer and the
run's env. Two ways to get the tokenizer, each in fresh interpreters, alternating:

* ``handed``: the driver's tokenizer, unpickled and registered (``agentrl.models.use_tokenizer``), as
  ``RayRuntime`` hands it to every worker and server;
* ``loaded``: ``resolve_tokenizer(cfg.model)`` loading it through ``AutoTokenizer``, as every worker did
  before (transformers' configuration classes and torch come with it).

Reported: each side's CPU seconds (user + system of the child, Ray's own start excluded), whether torch was
imported, and the ratio loaded / handed. Writes docs/benchmarks/actor_start.md.

Usage: python benchmarks/actor_start.py [--repeats 3] [--out docs/benchmarks/actor_start.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# argv: mode, the pickled config, the pickled tokenizer. Prints {"cpu_s": ..., "torch": ...}.
_CHILD = r"""
import json, pickle, resource, sys

mode, cfg_path, tok_path = sys.argv[1:4]
cfg = pickle.loads(open(cfg_path, "rb").read())
import agentrl
from agentrl.chat import ChatRenderer
from agentrl.models import resolve_tokenizer, use_tokenizer

if mode == "handed":
    use_tokenizer(cfg.model, pickle.loads(open(tok_path, "rb").read()))
renderer = ChatRenderer(resolve_tokenizer(cfg.model))
env = agentrl.make(cfg.env)
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": u.ru_utime + u.ru_stime, "torch": "torch" in sys.modules}))
"""


def run_child(mode: str, cfg_path: Path, tok_path: Path) -> dict[str, float | bool]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(cfg_path), str(tok_path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    result: dict[str, float | bool] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "actor_start.md"))
    args = ap.parse_args()

    from agentrl.models import resolve_tokenizer
    from agentrl.trainers.train_config import TrainConfig

    cfg = TrainConfig(model="tiny", env="math-tir-arith-v0")
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path, tok_path = Path(tmp) / "cfg.pkl", Path(tmp) / "tok.pkl"
        cfg_path.write_bytes(pickle.dumps(cfg))
        tok_path.write_bytes(pickle.dumps(resolve_tokenizer(cfg.model)))
        load_start = os.getloadavg()
        runs: dict[str, list[dict[str, float | bool]]] = {"handed": [], "loaded": []}
        for _ in range(args.repeats):
            for mode in runs:  # alternating, so a change in the machine's load moves both sides alike
                runs[mode].append(run_child(mode, cfg_path, tok_path))
        load_end = os.getloadavg()
    cpu = {m: statistics.median(float(r["cpu_s"]) for r in rs) for m, rs in runs.items()}
    torch = {m: any(bool(r["torch"]) for r in rs) for m, rs in runs.items()}
    ratio = cpu["loaded"] / cpu["handed"]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# A rollout worker's start: the handed tokenizer against loading it (`benchmarks/actor_start.py`)",
        "",
        f"{now}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
        f"{load_start[0]:.2f} -> {load_end[0]:.2f}; `tiny` model, `math-tir-arith-v0`; median of "
        f"{args.repeats} fresh interpreters per side, alternating. CPU seconds: unpickle the config, "
        "take the tokenizer, build the renderer and the env (Ray's own start excluded).",
        "",
        "| tokenizer | CPU seconds (median) | each run | torch imported |",
        "|---|---:|---|---|",
    ]
    for m in ("handed", "loaded"):
        each = ", ".join(f"{float(r['cpu_s']):.2f}" for r in runs[m])
        lines.append(f"| {m} | {cpu[m]:.2f} | {each} | {'yes' if torch[m] else 'no'} |")
    lines += ["", f"loaded / handed: **{ratio:.2f}x**", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
