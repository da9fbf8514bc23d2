"""The invariants of a chaos soak (``benchmarks/chaos.py``), checked after the run from what it left
behind: the run directory (``ledger.jsonl``, ``trajectories.jsonl``, ``metrics.jsonl``, ``config.json``)
and the machine's process table and cgroup tree.

* **Ledger.** Every record is replayed in order, and each must be a legal move of its group's state machine
  (``trainers/ray/ledger.py``), including the moves a driver restart makes (a lease of a group the
  dead driver had leased; a resume's rewind of trained → done and dropped → pending). After every record,
  ``issued = trained + dropped + in flight`` is recomputed for that record's step, and no step may hold more
  groups than ``groups_per_step``.
* **Tasks.** Every step that completed (a row in ``metrics.jsonl``) issued exactly the sampler's task seeds
  (``train_setup.task_seeds``), and each ended trained or dropped with a reason; nothing of it is in flight.
* **Trajectories.** No episode id (and sample index) is on disk twice (duplicated). Each trained group's
  attempt (its group id ``s<step>-t<seed>-a<attempt>``, from the ledger) has all ``group_size`` members on
  disk, each once (none lost).
* **Orphans.** No live process sits in a sandbox cgroup of one of the soak's rollout workers, and no cgroup
  directory of those workers (``agentrl-<pid>``, ``sb-<n>`` under it) is left.

Importable (the soak calls :func:`check_run` and :func:`orphans`) and runnable on a run directory:
``python benchmarks/chaos_check.py RUN_DIR``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

IN_FLIGHT = ("pending", "leased", "done")
_STATE_OF = {"issue": "pending", "lease": "leased", "done": "done", "release": "pending"}


def replay_ledger(path: Path, groups_per_step: int) -> dict[str, Any]:
    """Replay ``ledger.jsonl``; return the final state of every group, counters and every violation."""
    state: dict[tuple[int, int], str] = {}
    attempt: dict[tuple[int, int], int] = {}
    reason: dict[tuple[int, int], str] = {}
    violations: list[str] = []
    moves: Counter[str] = Counter()
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    records = 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            key = (int(rec["step"]), int(rec["seed"]))
            ev, att = str(rec["ev"]), int(rec.get("attempt", 0))
        except (ValueError, KeyError, TypeError):
            if n == len(lines):  # a line torn by a kill; the ledger's own replay truncates it too
                moves["torn last line"] += 1
                break
            violations.append(f"ledger line {n}: not a record: {line[:80]!r}")
            continue
        records += 1
        prev = state.get(key)
        ok = True
        if ev == "issue":
            ok = prev not in ("trained", "dropped")
            moves["re-issued (resume)" if prev is not None else "issued"] += 1
        elif ev == "lease":
            ok = prev in ("pending", "leased") and att == attempt.get(key, 0) + 1
            if prev == "leased":
                moves["leased again after a driver restart"] += 1
        elif ev == "done":
            ok = prev in ("leased", "trained") and att == attempt.get(key, -1)
            if prev == "trained":
                moves["rewound trained -> done (resume)"] += 1
        elif ev == "release":
            ok = prev in ("leased", "dropped") and att == attempt.get(key, -1)
            moves["released" if prev == "leased" else "rewound dropped -> pending (resume)"] += 1
        elif ev == "trained":
            ok = prev == "done"
        elif ev == "dropped":
            ok = prev in ("leased", "done", "pending") and bool(rec.get("reason"))
        else:
            ok = False
        if not ok:
            violations.append(
                f"ledger line {n}: {ev} of {key} (attempt {att}) from state {prev} "
                f"(attempt {attempt.get(key)}){'' if ev != 'dropped' else ' without a reason'}"
            )
        state[key] = (
            "dropped" if ev == "dropped" else "trained" if ev == "trained" else _STATE_OF.get(ev, "?")
        )
        attempt[key] = att
        reason[key] = str(rec.get("reason", ""))
        # The accounting at this record, for its step.
        step_states = Counter(s for k, s in state.items() if k[0] == key[0])
        issued = sum(1 for k in state if k[0] == key[0])
        flight = sum(step_states[s] for s in IN_FLIGHT)
        if issued != step_states["trained"] + step_states["dropped"] + flight:
            violations.append(f"ledger line {n}: issued {issued} != trained + dropped + in flight")
        if issued > groups_per_step:
            violations.append(f"ledger line {n}: step {key[0]} holds {issued} groups > {groups_per_step}")
    return {
        "records": records,
        "state": state,
        "attempt": attempt,
        "reason": reason,
        "moves": dict(moves),
        "violations": violations,
    }


def check_run(run: Path) -> dict[str, Any]:
    """Every invariant of the run directory (see the module doc): counts, and a list of problems."""
    cfg = json.loads((run / "config.json").read_text())
    batch = cfg.get("batch", cfg)  # grouped since TrainConfig's groups; a flat file from before also reads
    gps, size, seed = int(batch["groups_per_step"]), int(batch["group_size"]), int(cfg["seed"])
    led = replay_ledger(run / "ledger.jsonl", gps)
    problems: list[str] = list(led["violations"])
    rows = []
    if (run / "metrics.jsonl").exists():
        for line in (run / "metrics.jsonl").read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass  # a torn last line
    steps = sorted(int(r["step"]) for r in rows)
    if steps != list(range(len(steps))):
        problems.append(f"metrics.jsonl steps are not 0..{len(steps) - 1} once each: {steps[:50]}")
    completed = len(steps)
    state, attempt, reason = led["state"], led["attempt"], led["reason"]

    # Tasks: each completed step issued the sampler's seeds; each is trained or dropped with a reason.
    trained_keys: list[tuple[int, int]] = []
    dropped: list[tuple[int, int]] = []
    for k in range(completed):
        want = {seed * 1_000_003 + k * gps + j for j in range(gps)}  # train_setup.task_seeds
        have = {s for (st, s) in state if st == k}
        if have != want:
            problems.append(
                f"step {k}: the ledger holds seeds {sorted(have)}, the sampler's are {sorted(want)}"
            )
        for s in sorted(have):
            st = state[(k, s)]
            if st == "trained":
                trained_keys.append((k, s))
            elif st == "dropped":
                dropped.append((k, s))
                if not reason[(k, s)]:
                    problems.append(f"group {(k, s)} dropped without a reason")
            else:
                problems.append(f"group {(k, s)} of completed step {k} is still {st}")
    in_flight = sorted(k for k, st in state.items() if k[0] >= completed and st in IN_FLIGHT)
    beyond = sorted(k for k, st in state.items() if k[0] >= completed and st not in IN_FLIGHT)
    if any(st > completed for st, _ in beyond):  # only the interrupted step may have settled groups
        problems.append(f"groups settled beyond the interrupted step {completed}: {beyond[:10]}")

    # Trajectories: no duplicate, nothing of a trained group lost.
    by_id: Counter[tuple[str, int]] = Counter()
    members: dict[str, Counter[int]] = defaultdict(Counter)
    torn = 0
    lines = (
        (run / "trajectories.jsonl").read_text().splitlines() if (run / "trajectories.jsonl").exists() else []
    )
    for n, line in enumerate(lines, 1):
        try:
            meta = json.loads(line)["meta"]
        except (ValueError, KeyError):
            torn += 1
            if n != len(lines):
                problems.append(f"trajectories.jsonl:{n} is not a trajectory")
            continue
        eid = str(meta.get("episode_id", ""))
        by_id[(eid, int(meta.get("sample_index", 0)))] += 1
        m = re.fullmatch(r"(s\d+-t\d+-a\d+)-m(\d+)", eid)
        if m and int(meta.get("sample_index", 0)) == 0:
            members[m.group(1)][int(m.group(2))] += 1
    duplicated = sum(c - 1 for c in by_id.values() if c > 1)
    lost = 0
    for k, s in trained_keys:
        gid = f"s{k}-t{s}-a{attempt[(k, s)] - 1}"
        got = members.get(gid, Counter())
        missing = [m for m in range(size) if got[m] == 0]
        lost += len(missing)
        extra = sum(c - 1 for c in got.values() if c > 1)
        if missing or extra or set(got) - set(range(size)):
            problems.append(f"trained group {gid}: members on disk {dict(got)}, want 0..{size - 1} once each")
    if duplicated:
        problems.append(f"{duplicated} trajectories are on disk more than once")
    reasons = Counter(re.sub(r"\d+", "N", reason[k])[:90] for k in dropped)
    return {
        "steps": completed,
        "groups_trained": len(trained_keys),
        "groups_dropped": len(dropped),
        "dropped_reasons": dict(reasons),
        "groups_in_flight_at_stop": len(in_flight),
        "trajectories": len(lines) - torn,
        "torn_lines": torn,
        "lost": lost,
        "duplicated": duplicated,
        "ledger_records": led["records"],
        "ledger_moves": led["moves"],
        "ledger_violations": len(led["violations"]),
        "problems": problems,
    }


def _cgroup_dirs(pids: set[int]) -> list[str]:
    """``agentrl-<pid>`` cgroup directories (any hierarchy) of these pids, and everything under them."""
    names = {f"agentrl-{p}" for p in pids} | {f"agentrl-host-{p}" for p in pids}
    found = []
    for parent, dirs, _ in os.walk("/sys/fs/cgroup"):
        for d in list(dirs):
            if d in names:
                found.append(os.path.join(parent, d))
                dirs.remove(d)
        if parent.count("/") > 8:
            dirs.clear()
    return found


def orphans(worker_pids: set[int]) -> dict[str, Any]:
    """What the soak's rollout workers (``worker_pids``, dead by now) left behind: live processes in their
    sandbox cgroups, and their cgroup directories."""
    marks = tuple(f"/agentrl-{p}/" for p in worker_pids)
    procs = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cg = Path(f"/proc/{d}/cgroup").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ")[:120].decode(errors="replace")
        except OSError:
            continue
        if any(m in cg for m in marks):
            procs.append(f"{d}: {cmd}")
    dirs = _cgroup_dirs(worker_pids)
    sandbox_dirs = [os.path.join(d, s) for d in dirs for s in _listdir(d) if s.startswith("sb-")]
    return {"processes": procs, "cgroups": dirs, "sandbox_cgroups": sandbox_dirs}


def _listdir(d: str) -> list[str]:
    try:
        return [e for e in os.listdir(d) if os.path.isdir(os.path.join(d, e))]
    except OSError:
        return []


if __name__ == "__main__":
    res = check_run(Path(sys.argv[1]))
    print(json.dumps(res, indent=1))
    sys.exit(1 if res["problems"] else 0)
