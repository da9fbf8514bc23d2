"""Soak: 2,000 calls, 10 % hostile, 8 in flight; afterwards nothing is leaked and benign calls were right."""

from __future__ import annotations

import asyncio
import os
import random
import resource

import pytest

from agentrl.execution import Limits
from agentrl.sandbox import LocalSandbox
from agentrl.types import ToolStatus

from .conftest import MiB, requires_bwrap

pytestmark = [requires_bwrap, pytest.mark.usefixtures("no_leaks")]

HOSTILE = [
    ("while True: pass", {ToolStatus.TIMEOUT}),
    ("import time; time.sleep(10**9)", {ToolStatus.TIMEOUT}),
    (
        "import os\nwhile True: os.fork()",
        {ToolStatus.ERROR, ToolStatus.TIMEOUT, ToolStatus.KILLED, ToolStatus.OOM},
    ),
    ("x = bytearray(1 << 36)", {ToolStatus.OOM}),
    ("a=[]\nwhile 1: a.append(b'x'*10**7)", {ToolStatus.OOM}),
    ("while True: print('A' * 1000)", {ToolStatus.OUTPUT_LIMIT}),
    ("import ctypes; ctypes.string_at(0)", {ToolStatus.KILLED}),
    ("import os; os._exit(0)", {ToolStatus.ERROR}),
    ("import subprocess; subprocess.Popen(['sleep', '1000'], start_new_session=True)", {ToolStatus.OK}),
    ("import os; os.kill(-1, 9)", {ToolStatus.OK, ToolStatus.ERROR}),
    ("f = open('big', 'wb')\nwhile 1: f.write(b'0' * (1 << 20))", {ToolStatus.ERROR}),
    ("open('/etc/x', 'w')", {ToolStatus.ERROR}),
]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
async def test_soak_2000_calls_10_percent_hostile_8_in_flight():
    rng = random.Random(1234)
    total, lanes = 2000, 8
    plan = [rng.random() < 0.10 for _ in range(total)]
    limits = Limits(
        wall_s=3.0, memory_bytes=256 * MiB, max_processes=32, file_size_bytes=2 * MiB, scratch_bytes=8 * MiB
    )
    fds_before = _open_fds()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue: asyncio.Queue[tuple[int, bool]] = asyncio.Queue()
    for item in enumerate(plan):
        queue.put_nowait(item)
    wrong: list[str] = []
    counts = {"hostile": 0, "benign": 0, "state_kept": 0}

    async def lane() -> None:
        async with LocalSandbox(limits) as sb:
            expected = 0  # the lane's counter, which survives unless a hostile call lost the state
            while True:
                try:
                    i, hostile = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                if hostile:
                    code, allowed = HOSTILE[i % len(HOSTILE)]
                    # Calls meant to time out get a short deadline; the rest must end on their own limit.
                    r = await sb.run(code, timeout=0.5 if allowed == {ToolStatus.TIMEOUT} else None)
                    counts["hostile"] += 1
                    if r.status not in allowed:
                        wrong.append(f"hostile {code!r}: {r.status} {r.message} {r.stderr[-200:]}")
                    if r.state_lost:
                        expected = 0
                else:
                    r = await sb.run("n = globals().get('n', 0) + 1; n")
                    counts["benign"] += 1
                    expected += 1
                    if r.state_lost:
                        expected = 1
                    if r.status is not ToolStatus.OK or r.stdout != f"{expected}\n":
                        wrong.append(f"benign #{i}: {r.status} {r.stdout!r} expected {expected}")
                        expected = int(r.stdout) if r.stdout.strip().isdigit() else 0
                    elif expected > 1:
                        counts["state_kept"] += 1

    await asyncio.wait_for(asyncio.gather(*(lane() for _ in range(lanes))), timeout=600)
    assert counts["hostile"] + counts["benign"] == total
    assert counts["hostile"] >= 150
    assert not wrong, "\n".join(w[:300] for w in wrong[:10])
    assert counts["state_kept"] > 1000  # sessions really were stateful across calls
    assert _open_fds() <= fds_before + 5
    growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert growth_mb < 50
