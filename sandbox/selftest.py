"""Startup self-test: make every limit trip once, and refuse to run when one does not (fail closed).

Limits that are silently not applied are the most common real failure of code sandboxes (cgroup v1-only
code on a v2 host, RLIMIT_NPROC ignored for root, a container runtime that drops a flag). So before the
first local sandbox of a process starts, a throw-away sandbox with small limits runs code that must hit:
the wall clock, the memory limit, the process limit, the file-size limit, the network namespace, the
environment allow-list, the read-only root, the PID namespace and (on x86_64) the seccomp filter. The result
is cached per process and configuration, so it costs about half a second once, not per sandbox.

The self-test knows no backend: it is given a :class:`SelfTestTarget`, whose factory makes the throw-away
probe sandboxes (``LocalSandbox.self_test_target()`` builds one for its own configuration).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrl.errors import SandboxSelfTestError
from agentrl.execution import ExecResult, Limits
from agentrl.types import ToolStatus

from . import _seccomp
from ._layout import sandbox_env

__all__ = ["Probe", "SelfTestReport", "SelfTestTarget", "clear_cache", "ensure_self_test", "run_self_test"]

log = logging.getLogger(__name__)
MiB = 1024 * 1024

_TEST_LIMITS = Limits(
    wall_s=5.0,
    memory_bytes=128 * MiB,
    max_processes=16,
    output_bytes=16 * 1024,
    file_size_bytes=1 * MiB,
    scratch_bytes=16 * MiB,
)


@dataclass(frozen=True)
class SelfTestReport:
    """Which limits tripped during the self-test."""

    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)
    """Check name -> (passed, detail)."""
    duration_s: float = 0.0
    """How long the self-test took."""

    @property
    def passed(self) -> bool:
        """True when at least one check ran and every check passed."""
        return bool(self.checks) and all(ok for ok, _ in self.checks.values())

    @property
    def failed(self) -> list[str]:
        """Names of the checks that failed."""
        return [name for name, (ok, _) in self.checks.items() if not ok]

    def summary(self) -> str:
        """One line per check: ``ok``/``FAIL``, its name and detail."""
        lines = [f"{'ok  ' if ok else 'FAIL'} {name}: {detail}" for name, (ok, detail) in self.checks.items()]
        return "\n".join(lines)


class Probe(Protocol):
    """A throw-away sandbox the self-test starts, runs its checks in, and closes."""

    async def start(self) -> None:
        """Start now; raise when the sandbox cannot start."""
        ...

    async def run(self, code: str, *, timeout: float | None = None) -> ExecResult:
        """Run one check."""
        ...

    async def close(self) -> None:
        """Release everything."""
        ...


@dataclass(frozen=True)
class SelfTestTarget:
    """One sandbox configuration to test: how to make probes of it, and what its result depends on."""

    key: Hashable
    """What the result depends on; results are cached per process under it."""
    make_probe: Callable[[Limits], Probe]
    """A sandbox of this configuration with the given (small) limits, that starts without running the
    self-test itself and even when a limit is off (the self-test must be able to see that)."""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Variables the configuration adds to the sandbox's environment allow-list."""
    unsafe: bool = False
    """Start anyway, with a warning, when a limit does not trip (never in training)."""
    advice: Callable[[Sequence[str]], str] | None = None
    """Given the failed checks' names, what the host lacks and what to do (added to the refusal)."""


# Runs inside the sandbox; prints one "name=ok|FAIL detail" line per check.
_STATIC_CHECKS = r"""
import errno, os, socket
def check(name, ok, detail=""):
    print("%s=%s %s" % (name, "ok" if ok else "FAIL", str(detail).replace("\n", " ")[:200]))
try:
    with open("/tmp/agentrl-fsize", "wb") as f:
        f.write(b"0" * {fsize_try})
    check("file_size", False, "wrote {fsize_try} bytes under a {fsize} byte limit")
except OSError as e:
    check("file_size", e.errno == errno.EFBIG, repr(e))
finally:
    try: os.unlink("/tmp/agentrl-fsize")
    except OSError: pass
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
    check("network", False, "reached a listener on the host's loopback")
except OSError as e:
    names = [n for _, n in socket.if_nameindex()]
    try:
        socket.create_connection(("192.0.2.1", 9), timeout=1).close()
        check("network", False, "reached an outside address")
    except OSError as e2:
        check("network", names == ["lo"], "interfaces=%s host=%r outside=%r" % (names, e, e2))
env = dict(os.environ)
check("env", env == {env!r}, sorted(env))
bad = []
for p in ("/usr/agentrl-probe", "/agentrl-probe", "/etc/agentrl-probe"):
    try:
        open(p, "w").close()
        bad.append(p)
    except OSError:
        pass
check("read_only_root", not bad, bad or "writes outside the scratch dir fail")
check("pid_namespace", os.getpid() in (1, 2), "pid %d" % os.getpid())
if {seccomp}:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.unshare(0)  # a no-op that succeeds unless the filter denies it
    err = ctypes.get_errno()
    check("seccomp", rc == -1 and err == errno.EPERM, "unshare(0) -> %d errno %d" % (rc, err))
"""

_FORK_CHECK = r"""
import os, time
n = 0
try:
    for _ in range({tries}):
        pid = os.fork()
        if pid == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
except OSError as e:
    print("stopped", n, e.errno)
else:
    print("unlimited", n)
"""


async def _run_checks(target: SelfTestTarget) -> SelfTestReport:
    t0 = time.perf_counter()
    checks: dict[str, tuple[bool, str]] = {}
    lim = _TEST_LIMITS
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = target.make_probe(lim)
    try:
        try:
            await probe.start()
        except Exception as e:
            checks["start"] = (False, f"a sandbox could not start: {e}")
            return SelfTestReport(checks, time.perf_counter() - t0)

        async def run(code: str, timeout: float) -> Any:
            # The outer deadline catches a sandbox whose own wall clock does not work.
            try:
                return await asyncio.wait_for(probe.run(code, timeout=timeout), timeout + 1.5)
            except TimeoutError:
                return None

        expect_seccomp = _seccomp.deny_filter() is not None
        code = _STATIC_CHECKS.format(
            fsize=lim.file_size_bytes,
            fsize_try=lim.file_size_bytes * 2,
            port=port,
            env=sandbox_env(lim, target.extra_env),
            seccomp=expect_seccomp,
        )
        r = await run(code, 10.0)
        names = ["file_size", "network", "env", "read_only_root", "pid_namespace"]
        if expect_seccomp:
            names.append("seccomp")
        seen: dict[str, tuple[bool, str]] = {}
        if r is not None:
            for line in r.stdout.splitlines():
                name, _, rest = line.partition("=")
                verdict, _, detail = rest.partition(" ")
                seen[name] = (verdict == "ok", detail)
        for name in names:
            checks[name] = seen.get(
                name,
                (False, f"check did not run: {r.status if r else 'hung'} {r.stderr[-300:] if r else ''}"),
            )

        r = await run(_FORK_CHECK.format(tries=lim.max_processes + 32), 10.0)
        if r is None or r.status is not ToolStatus.OK:
            checks["processes"] = (False, f"fork test ended with {r and r.status}: {r and r.stderr[-300:]}")
        else:
            words = r.stdout.split()
            n = int(words[1]) if len(words) > 1 and words[1].isdigit() else -1
            ok = words[:1] == ["stopped"] and 0 <= n < lim.max_processes
            checks["processes"] = (ok, f"{r.stdout.strip()} (limit {lim.max_processes})")

        r = await run(f"x = b'x' * {lim.memory_bytes + 64 * MiB}\nlen(x)", 10.0)
        checks["memory"] = (
            r is not None and r.status is ToolStatus.OOM,
            f"allocating {lim.memory_bytes // MiB + 64} MiB under {lim.memory_bytes // MiB} MiB -> "
            f"{r.status if r else 'hung'}",
        )

        t = time.perf_counter()
        r = await run("import time\ntime.sleep(30)", 0.25)
        took = time.perf_counter() - t
        checks["wall"] = (
            r is not None and r.status is ToolStatus.TIMEOUT and took < 2.0,
            f"sleep(30) under a 0.25 s limit -> {r.status if r else 'hung'} after {took:.2f} s",
        )
        r = await run("print(1 + 1)", 10.0)
        checks["restart"] = (
            r is not None and r.status is ToolStatus.OK and r.stdout == "2\n",
            f"after the timeout: {r.status if r else 'hung'} {r.stdout.strip() if r else ''}",
        )
    finally:
        await probe.close()
        server.close()
        await server.wait_closed()
    return SelfTestReport(checks, time.perf_counter() - t0)


_cache: dict[Hashable, SelfTestReport] = {}
_inflight: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[Hashable, asyncio.Future[SelfTestReport]]
] = weakref.WeakKeyDictionary()


async def _cached(target: SelfTestTarget) -> SelfTestReport:
    key = target.key
    if key in _cache:
        return _cache[key]
    loop = asyncio.get_running_loop()
    pending = _inflight.setdefault(loop, {})
    if key in pending:
        return await asyncio.shield(pending[key])
    fut: asyncio.Future[SelfTestReport] = loop.create_future()
    pending[key] = fut
    try:
        report = await _run_checks(target)
    except BaseException as e:
        fut.set_exception(e)
        fut.exception()  # mark retrieved; waiters re-raise it
        raise
    finally:
        pending.pop(key, None)
    # Only a pass is kept. A failure may be the probe's own (killed from outside, starved on a loaded
    # machine: "check did not run"); kept, it refused every later sandbox of the process, so a long-lived
    # rollout worker failed all its groups. The next start tests again, and a real gap fails it again.
    if report.passed:
        _cache[key] = report
    fut.set_result(report)
    if report.passed:
        log.info("sandbox self-test passed in %.2f s", report.duration_s)
    else:
        log.error("sandbox self-test FAILED:\n%s", report.summary())
    return report


async def ensure_self_test(target: SelfTestTarget) -> SelfTestReport:
    """Run the self-test for ``target``'s configuration once per process (again at the next call after a
    failure); raise unless it passed or the target is ``unsafe``."""
    report = await _cached(target)
    if not report.passed:
        if target.unsafe:
            log.warning("starting an UNSAFE sandbox although limits %s did not trip", report.failed)
        else:
            advice = target.advice(report.failed) if target.advice is not None else ""
            raise SandboxSelfTestError(
                "the sandbox self-test failed, refusing to start (pass unsafe=True to override): "
                + "; ".join(f"{n}: {report.checks[n][1]}" for n in report.failed)
                + (f". {advice}" if advice else "")
            )
    return report


async def run_self_test(target: SelfTestTarget) -> SelfTestReport:
    """Run the self-test for ``target`` now (uncached) and return the report; never raises for a failed
    limit."""
    return await _run_checks(target)


def clear_cache() -> None:
    """Forget cached self-test results (tests use this)."""
    _cache.clear()


if (
    __name__ == "__main__"
):  # ``python -m agentrl.sandbox.selftest``: the same report as ``-m agentrl.sandbox``
    import runpy

    runpy.run_module("agentrl.sandbox", run_name="__main__")
