"""What a per-sandbox host uid costs at start, as root: one-shot LocalSandbox (start, ``1 + 1``, close),
serial, with ``host_uids`` on (the default as root) and ``off``, interleaved so that both see the same load.

Usage: python benchmarks/sandbox_host_uids.py [--n 30]   (as root; prints a markdown table)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentrl.execution import Limits  # noqa: E402
from agentrl.sandbox import LocalSandbox, _uids  # noqa: E402
from agentrl.sandbox._layout import python_layout  # noqa: E402
from agentrl.sandbox.local import find_bwrap  # noqa: E402


async def one(host_uids: str | None) -> float:
    t = time.perf_counter()
    async with LocalSandbox(Limits(wall_s=10), host_uids=host_uids) as sb:
        r = await sb.run("1 + 1")
        if r.stdout != "2\n":
            raise RuntimeError(f"sandbox failed: {r}")
    return 1000 * (time.perf_counter() - t)


async def main(n: int) -> None:
    if os.geteuid() != 0:
        sys.exit("run as root: host uids apply only there")
    modes: dict[str, str | None] = {"host uids (default as root)": None, "host_uids='off'": "off"}
    for m in modes.values():
        await one(m)  # the self-test and a warm-up
    ms: dict[str, list[float]] = {k: [] for k in modes}
    for _ in range(n):
        for k, m in modes.items():
            ms[k].append(await one(m))
    bwrap = find_bwrap()
    blocked = _uids.blocked_dirs([*python_layout()[1], bwrap or ""])
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, load average {load:.1f}, {n} starts each")
    print(f"closed directories the launcher opens: {blocked or 'none'}")
    print("| mode | p50 ms | p90 ms |\n|---|---:|---:|")
    for k, xs in ms.items():
        xs.sort()
        print(f"| {k} | {statistics.median(xs):.1f} | {xs[int(0.9 * (len(xs) - 1))]:.1f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    asyncio.run(main(ap.parse_args().n))
