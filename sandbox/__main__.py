"""``python -m agentrl.sandbox`` (or ``python -m agentrl.sandbox.selftest``): can the local sandbox run here?

Prints what this host offers (user, bubblewrap, cgroups, per-sandbox host uids), then the startup
self-test as a table (one row per limit: PASS or FAIL, and what happened), then one verdict line with
what to do when it failed. Exits 0 when every limit tripped, 1 when one did not (the sandbox would refuse
to start), 2 when the command itself was misused. Settings come from the same variables the trainer reads:
``AGENTRL_BWRAP``, ``AGENTRL_SANDBOX_UIDS``, ``AGENTRL_CGROUP_PARENT``.

``python -m agentrl.sandbox --reap`` instead removes the sandbox cgroups of agentrl processes that are dead
(killing what is left in them), prints what it removed, killed and kept, and exits 0 when nothing of a dead
process was kept, else 1 (``--dry-run``: only list them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Sequence

from agentrl.errors import AgentRLError

from . import _cgroup
from .local import LocalSandbox, find_bwrap


def _bwrap_line() -> str:
    path = find_bwrap()
    if path is None:
        return "not found (apt install bubblewrap, or AGENTRL_BWRAP=/path/to/bwrap)"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
        version = out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        version = f"does not run: {e}"
    return f"{path} ({version})"


def _reap(*, dry_run: bool, as_json: bool) -> int:
    from ._reaper import reap_cgroups

    report = reap_cgroups(dry_run=dry_run)
    if as_json:
        out = {"dry_run": dry_run, "removed": report.removed, "killed": report.killed, "kept": report.kept}
        print(json.dumps(out, indent=2))
    else:
        verb = "would remove" if dry_run else "removed"
        for folder in report.removed:
            print(f"{verb} {folder}")
        for pid in report.killed:
            print(f"killed process {pid}")
        for folder, why in report.kept:
            print(f"kept {folder}: {why}")
        print(f"{len(report.removed)} {verb}, {len(report.killed)} killed, {len(report.kept)} kept")
    return 0 if report.clean else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the local sandbox's self-test and print the report; the exit status says whether it passed."""
    ap = argparse.ArgumentParser(prog="python -m agentrl.sandbox", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--host-uids", default=None, help="uid range FIRST-LAST or 'off' (default: $AGENTRL_SANDBOX_UIDS)"
    )
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object")
    ap.add_argument(
        "--reap",
        action="store_true",
        help="remove the sandbox cgroups of dead agentrl processes (killing what is left in them) and exit",
    )
    ap.add_argument("--dry-run", action="store_true", help="with --reap: only list what would be removed")
    ns = ap.parse_args(argv)
    if ns.dry_run and not ns.reap:
        ap.error("--dry-run goes with --reap")
    if ns.reap:
        return _reap(dry_run=ns.dry_run, as_json=ns.json)
    try:
        sb = LocalSandbox(self_test=False, host_uids=ns.host_uids)
        from .selftest import run_self_test

        report = asyncio.run(run_self_test(sb.self_test_target()))
    except AgentRLError as e:
        print(f"python -m agentrl.sandbox: error: {e}", file=sys.stderr)
        return 2
    cg = _cgroup.manager()
    uids = sb.host_uids
    facts = {
        "user": f"uid {os.geteuid()}" + (" (root)" if os.geteuid() == 0 else ""),
        "bwrap": _bwrap_line(),
        "cgroups": (
            f"v{cg.version}: " + ", ".join(f"{k} {v}" for k, v in cg.parents.items())
            if cg.available
            else f"none ({cg.reason})"
        ),
        "host uids": str(uids) if uids is not None else f"not used ({sb._uid_problem})",
    }
    advice = sb._advice(report.failed) if not report.passed else ""
    if ns.json:
        out = {
            "passed": report.passed,
            "host": facts,
            "checks": {k: {"passed": ok, "detail": d} for k, (ok, d) in report.checks.items()},
            "duration_s": round(report.duration_s, 3),
            "advice": advice,
        }
        print(json.dumps(out, indent=2))
        return 0 if report.passed else 1
    for k, v in facts.items():
        print(f"{k:>10}: {v}")
    print()
    width = max(len(k) for k in report.checks) if report.checks else 5
    print(f"{'check':<{width}}  result  detail")
    print(f"{'-' * width}  ------  {'-' * 40}")
    for name, (ok, detail) in report.checks.items():
        print(f"{name:<{width}}  {'PASS' if ok else 'FAIL':<6}  {detail[:160]}")
    print()
    if report.passed:
        print(f"PASSED in {report.duration_s:.2f} s: every limit tripped; the local sandbox can run here.")
        return 0
    print(f"FAILED ({', '.join(report.failed)}): LocalSandbox refuses to start on this host.")
    if advice:
        print(advice)
    return 1


if __name__ == "__main__":
    sys.exit(main())
