"""The gateway under load (``benchmarks/gateway.py --load``): 256 concurrent sessions of several turns each,
real HTTP on loopback, an instant scripted policy, the server in its own process with a trajectory store and
an idle-session timeout (as ``agentrl gateway`` runs it).

Each session is a 3-turn tool conversation (echo its own word, echo it again, answer) and then ``finish``.
Its word (``r<round>w<index>x``) is in the question, and the scripted policy reads it from the prompt, so
every turn, tool call and answer of a session carries it: a trajectory that holds another session's word was
mixed. Rounds:

* a warm-up round (its RSS is the baseline: the server's caches, pools and arenas are filled), then
  ``--rounds`` normal rounds: p50/p99 time per turn inside the server, the same at the client, sessions/s,
  and the server's RSS sampled during each;
* a faulty round: of every four sessions one is normal, one disconnects mid-stream (turn 2 asked with
  ``"stream": true``, the connection closed after the first chunk), one sends a body that is not JSON as its
  first request, and one sends one as its second; the server must answer the bodies with 400 and keep
  serving, and each of these sessions must end recorded as cancelled (the idle timeout closes it) or refused
  (it never opened);
* a last normal round (the server keeps serving), then the wait for the idle timeout, and the RSS after.

Invariants, from the store the server wrote: each normal session is exactly one trainable trajectory with
reward 1 and only its own word (none lost, none mixed, none twice); each session cut off mid-stream or
mid-conversation is one ``cancelled`` trajectory (an infrastructure failure, never trained on); a session
refused at its first request is nowhere; no session is left open; RSS after the last round is within
``--rss-slack-mb`` of the warm-up baseline.

    .venv/bin/python benchmarks/gateway.py --load            # writes docs/benchmarks/gateway_load.md
    .venv/bin/python benchmarks/gateway_load.py --sessions 32 --rounds 1 --no-docs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs" / "benchmarks" / "gateway_load.md"
SYSTEM = "You repeat words with the echo tool, then answer."
ECHO = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Return the text unchanged.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}
WORD = re.compile(r"r\d+w\d+x")
KINDS = ("normal", "disconnect", "malformed_first", "malformed_mid")


def question(word: str) -> str:
    return f"Echo the word {word} twice with the tool, then answer with it."


# ------------------------------------------------------------------------------------------------ server
def make_policy(renderer: Any) -> Any:
    """An instant scripted policy that plays the session whose prompt it is given: its word from the question,
    the turn from the assistant turns so far."""
    from agentrl.testing import ScriptedPolicy

    tok, stop = renderer.tokenizer, renderer.stop_token_ids[0]
    turn_mark = "<|im_start|>assistant"

    def turn(prompt_ids: Any) -> list[int]:
        text = tok.decode(list(prompt_ids), skip_special_tokens=False)
        found = WORD.findall(text)
        word = found[0] if found else "none"
        k = text.count(turn_mark) - 1
        call = '<tool_call>\n{"name": "echo", "arguments": {"text": "%s"}}\n</tool_call>'
        out = call % word if k == 0 else call % (word + " again") if k == 1 else f"Answer: {word}"
        return [*tok.encode(out, add_special_tokens=False), stop]

    policy = ScriptedPolicy(turn, stop_ids=renderer.stop_token_ids)
    policy.calls = _Last()  # it keeps every prompt; a load test would keep them all
    return policy


class _Last(list):  # type: ignore[type-arg]
    def append(self, item: Any) -> None:
        self[:] = [item]


async def serve(store_path: str, session_timeout: float) -> None:
    """The server process: the gateway with a store and an idle timeout, its app timed (gateway._Timed)."""
    sys.path.insert(0, str(HERE))
    import gateway as bench

    import agentrl.trainers.gateway.server as server
    from agentrl import JsonlStore
    from agentrl.chat import ChatRenderer
    from agentrl.models import smollm2_tokenizer
    from agentrl.trainers.gateway import Gateway

    renderer = ChatRenderer(smollm2_tokenizer())
    build = server.build_app
    server.build_app = lambda core, **kw: bench._Timed(build(core, **kw))  # type: ignore[assignment,return-value]
    store = JsonlStore(store_path)
    async with Gateway(make_policy(renderer), renderer, store=store, session_timeout=session_timeout) as gw:
        print(f"URL {gw.url}", flush=True)
        await asyncio.Event().wait()


# ------------------------------------------------------------------------------------------------ clients
@dataclass
class Outcome:
    """What the client saw of one session."""

    sid: str
    word: str
    kind: str
    statuses: list[int] = field(default_factory=list)
    finished: bool = False
    error: str = ""


def _body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "p", "messages": messages, "tools": [ECHO], "max_tokens": 64, **extra}


async def session(http: Any, sid: str, word: str, kind: str, lat: list[float]) -> Outcome:
    """One session of ``kind`` (see the module doc)."""
    out = Outcome(sid, word, kind)
    url = f"/s/{sid}/v1/chat/completions"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question(word)},
    ]
    try:
        for k in range(3):
            if (kind == "malformed_first" and k == 0) or (kind == "malformed_mid" and k == 1):
                r = await http.post(
                    url, content=b'{"model": "p", "messages": [', headers={"content-type": "application/json"}
                )
                out.statuses.append(r.status_code)
                return out  # the client gives up on the session
            if kind == "disconnect" and k == 1:
                async with http.stream("POST", url, json=_body(messages, stream=True)) as r:
                    out.statuses.append(r.status_code)
                    async for _ in r.aiter_raw():
                        break  # read the first chunk, then drop the connection
                return out
            t0 = time.perf_counter()
            r = await http.post(url, json=_body(messages))
            lat.append(time.perf_counter() - t0)
            out.statuses.append(r.status_code)
            if r.status_code != 200:
                out.error = r.text[:200]
                return out
            msg = r.json()["choices"][0]["message"]
            messages.append(msg)
            if not msg.get("tool_calls"):
                break
            call = msg["tool_calls"][0]
            text = json.loads(call["function"]["arguments"])["text"]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        r = await http.post(f"/s/{sid}/finish", json={"reward": 1.0})
        out.statuses.append(r.status_code)
        out.finished = r.status_code == 200
        if not out.finished:
            out.error = r.text[:200]
    except Exception as e:  # the client's own view of a failure: the session counts as lost
        out.error = f"{type(e).__name__}: {e}"
    return out


async def run_round(
    url: str, tag: str, n: int, *, faulty: bool, rss_of: Any = None
) -> tuple[list[Outcome], dict[str, Any]]:
    """``n`` sessions at once (``faulty``: the four kinds in turn); the client latencies, the server's own
    times per turn (``/bench/stats`` when the server has it), sessions/s and the peak RSS sampled."""
    import httpx

    lat: list[float] = []
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    peak = [0]
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await http.get("/bench/stats")  # clear
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set() and rss_of is not None:
                peak[0] = max(peak[0], rss_of())
                await asyncio.sleep(0.05)

        sampler = asyncio.ensure_future(sample())
        t0 = time.perf_counter()
        outs = await asyncio.gather(
            *(
                session(http, f"{tag}-{i}", f"{tag}w{i:04d}x", KINDS[i % 4] if faulty else "normal", lat)
                for i in range(n)
            )
        )
        wall = time.perf_counter() - t0
        done.set()
        await sampler
        r = await http.get("/bench/stats")
        inside = r.json() if r.status_code == 200 else []
    stats: dict[str, Any] = {
        "sessions": n,
        "wall_s": wall,
        "sessions_per_s": sum(o.finished for o in outs) / wall,
        "turns": len(lat),
        "client_ms": _pcts(lat),
        "server_ms": _pcts(inside),
        "rss_peak_mib": peak[0] / 2**20,
    }
    return list(outs), stats


def _pcts(xs: list[float]) -> dict[str, float]:
    if len(xs) < 2:
        return {"p50": float("nan"), "p99": float("nan")}
    q = statistics.quantiles(xs, n=100)
    return {"p50": statistics.median(xs) * 1e3, "p99": q[98] * 1e3}


def check(outcomes: list[Outcome], store_path: Path, tokenizer: Any) -> dict[str, Any]:
    """The invariants (module doc) over every session the client ran, from the server's store."""
    from agentrl import read_trajectories

    by_sid: dict[str, list[Any]] = defaultdict(list)
    for t in read_trajectories(store_path):
        by_sid[t.meta.task_id].append(t)
    problems: list[str] = []
    kinds: Counter[str] = Counter()
    for o in outcomes:
        trajs = by_sid.pop(o.sid, [])
        if o.kind == "normal":
            expired = "session_expired" in o.error and o.statuses[-1] == 409
            if expired and len(trajs) == 1 and trajs[0].stop_reason.value == "cancelled":
                # The idle timeout closed it between two of its requests (told with a 409 and recorded as
                # cancelled): accounted for, not lost, but counted apart.
                kinds["expired"] += 1
                continue
            if not o.finished or len(trajs) != 1:
                problems.append(
                    f"{o.sid}: finished={o.finished} {o.error!r}, {len(trajs)} trajectories (lost)"
                )
                continue
            t = trajs[0]
            words = set(WORD.findall(tokenizer.decode(list(t.token_ids), skip_special_tokens=False)))
            if words != {o.word} or t.infra_failure or t.reward != 1.0 or t.num_turns != 3:
                problems.append(f"{o.sid}: words {sorted(words)[:4]}, turns {t.num_turns} (mixed or cut)")
            kinds["finished"] += 1
        elif o.kind == "malformed_first":
            if o.statuses != [400] or trajs:
                problems.append(f"{o.sid}: statuses {o.statuses}, {len(trajs)} trajectories (want refused)")
            kinds["refused"] += 1
        else:
            want = [200, 400] if o.kind == "malformed_mid" else [200, 200]
            cancelled = (
                len(trajs) == 1 and trajs[0].stop_reason.value == "cancelled" and trajs[0].infra_failure
            )
            if o.statuses != want or not cancelled:
                got = [(t.stop_reason.value, t.infra_failure) for t in trajs]
                problems.append(f"{o.sid}: statuses {o.statuses}, trajectories {got} (want one cancelled)")
            kinds["cancelled"] += 1
    if by_sid:
        problems.append(f"trajectories of sessions nobody ran: {sorted(by_sid)[:5]}")
    return {"kinds": dict(kinds), "problems": problems}


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def settle(url: str, timeout: float) -> int:
    """Wait for the server to expire every abandoned session; the sessions still open."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        deadline = time.monotonic() + timeout
        while True:
            left = int((await http.get("/health")).json()["open_sessions"])
            if not left or time.monotonic() > deadline:
                return left
            await asyncio.sleep(0.25)


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=256, help="sessions at once per round")
    ap.add_argument("--rounds", type=int, default=3, help="measured normal rounds")
    ap.add_argument("--session-timeout", type=float, default=30.0, help="the server's idle-session timeout")
    ap.add_argument("--rss-slack-mb", type=float, default=16.0, help="RSS growth allowed over the baseline")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--serve", nargs=2, metavar=("STORE", "TIMEOUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args.serve[0], float(args.serve[1])))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from agentrl.models import smollm2_tokenizer

    tok = smollm2_tokenizer()
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-gwload-"))
    store = tmp / "trajectories.jsonl"
    cmd = [sys.executable, __file__, "--serve", str(store), str(args.session_timeout)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    load0 = os.getloadavg()[0]
    try:
        assert proc.stdout is not None
        m = re.match(r"URL (\S+)", proc.stdout.readline())
        assert m, "the server did not start"
        url = m.group(1)
        cold = rss(proc.pid)
        n = args.sessions
        outcomes, _ = asyncio.run(run_round(url, "r0", n, faulty=False))
        asyncio.run(settle(url, 5))
        base = rss(proc.pid)
        rounds = []
        for k in range(1, args.rounds + 1):
            outs, st = asyncio.run(run_round(url, f"r{k}", n, faulty=False, rss_of=lambda: rss(proc.pid)))
            outcomes += outs
            rounds.append(st | {"rss_after_mib": rss(proc.pid) / 2**20})
        k = args.rounds + 1
        outs, faulty = asyncio.run(run_round(url, f"r{k}", n, faulty=True, rss_of=lambda: rss(proc.pid)))
        outcomes += outs
        outs, last = asyncio.run(run_round(url, f"r{k + 1}", n, faulty=False, rss_of=lambda: rss(proc.pid)))
        outcomes += outs
        still_open = asyncio.run(settle(url, args.session_timeout * 2 + 15))
        after = rss(proc.pid)
        alive = proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    verdict = check(outcomes, store, tok)
    problems = list(verdict["problems"])
    if still_open:
        problems.append(f"{still_open} sessions still open after the idle timeout")
    if not alive:
        problems.append("the server died")
    growth = (after - base) / 2**20
    if growth > args.rss_slack_mb:
        problems.append(f"RSS grew {growth:.1f} MiB over the warm-up baseline (allowed {args.rss_slack_mb})")
    res = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load": {"start_1min": round(load0, 1), "end_1min": round(os.getloadavg()[0], 1)},
        "sessions_per_round": args.sessions,
        "session_timeout_s": args.session_timeout,
        "rss_mib": {"cold": cold / 2**20, "baseline": base / 2**20, "after": after / 2**20},
        "rounds": rounds,
        "faulty_round": faulty,
        "last_round": last,
        "sessions": verdict["kinds"],
        "problems": problems,
        "ok": not problems,
    }
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if not args.no_docs:
        DOCS.write_text(markdown(res))
        print(f"wrote {DOCS}")
    return 0 if res["ok"] else 1


def markdown(res: dict[str, Any]) -> str:
    n, r = res["sessions_per_round"], res["rss_mib"]
    rows = [_row(f"normal round {i + 1}", st) for i, st in enumerate(res["rounds"])]
    rows.append(_row("faulty round (1/4 disconnect mid-stream, 1/2 a malformed body)", res["faulty_round"]))
    rows.append(_row("normal round after it", res["last_round"]))
    kinds = res["sessions"]
    verdict = "every invariant held" if res["ok"] else "PROBLEMS: " + "; ".join(res["problems"][:5])
    return "\n".join(
        [
            "# The gateway under load",
            "",
            f"`benchmarks/gateway.py --load`: {n} sessions at once per round, "
            "each a 3-turn tool conversation",
            "(echo its own word twice, answer) and `finish`, over real HTTP on "
            "loopback (httpx, one connection",
            "per session), against an instant scripted policy behind the "
            "recording gateway in its own process",
            "(real SmolLM2 tokenizer and template, a JSONL trajectory store, a "
            f"{res['session_timeout_s']:g} s idle-session timeout). Server",
            "time is from the app receiving a turn request to its last byte handed to the socket.",
            "",
            f"Run {res['date']}; {res['machine']}; 1-minute load average {res['load']['start_1min']} at the",
            f"start and {res['load']['end_1min']} at the end (shared with other jobs: contended numbers).",
            "",
            "| round | turns | server p50 ms | server p99 ms | client p50 ms | "
            "client p99 ms | sessions/s | server RSS"
            " peak MiB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            f"Server RSS: {r['cold']:.0f} MiB started, {r['baseline']:.0f} MiB after the warm-up round (the",
            f"baseline), {r['after']:.0f} MiB after the last round and the idle timeout"
            f" ({r['after'] - r['baseline']:+.1f} MiB).",
            f"Sessions: {kinds.get('finished', 0)} finished, each one trainable "
            "trajectory with only its own word;",
            f"{kinds.get('cancelled', 0)} cut off (mid-stream or after a malformed body) and recorded as",
            f"`cancelled`; {kinds.get('refused', 0)} refused at their first request (400, nothing recorded);",
            f"{kinds.get('expired', 0)} normal sessions closed by the idle timeout between two of their"
            " requests (answered 409 `session_expired`, recorded as `cancelled`).",
            f"Verdict: {verdict}.",
            "",
        ]
    )


def _row(name: str, st: dict[str, Any]) -> str:
    s, c = st["server_ms"], st["client_ms"]
    return (
        f"| {name} | {st['turns']} | {s['p50']:.2f} | {s['p99']:.2f} | {c['p50']:.1f} | {c['p99']:.1f} | "
        f"{st['sessions_per_s']:.1f} | {st['rss_peak_mib']:.0f} |"
    )


if __name__ == "__main__":
    sys.exit(main())
