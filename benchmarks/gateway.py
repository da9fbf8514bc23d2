"""Gateway overhead: a request through the recording gateway versus calling the policy directly.

The policy is instant (agentrl.testing.ScriptedPolicy with a fixed three-turn tool conversation), so what is
measured is the gateway: HTTP over loopback, JSON, request validation, the append-only check of the
messages, rendering and tokenizing the delta with the real SmolLM2 chat template and tokenizer, parsing the
tool calls, and on finish building and auditing the trajectory. The server runs in its own process (as it
would in front of a trainer); clients are httpx (raw) and the openai client, each session a real 3-turn
conversation that resends its whole history. Side by side in one run:

* direct: ``await policy.generate(ids)`` in process (the floor);
* native rollout: the same conversation as an in-process Env episode (per model turn);
* gateway, one session at a time: request latency at the client (p50/p90/p99), httpx and openai;
* gateway, many sessions at once (16, 64): latency, throughput, and the server's CPU per request.

Target (issue 16): <= 2 ms p50 overhead per request on 2 cores.

    .venv/bin/python benchmarks/gateway.py            # writes docs/benchmarks/gateway.md
    .venv/bin/python benchmarks/gateway.py --quick
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
import time
from pathlib import Path
from typing import Any

SYSTEM = "You repeat words with the echo tool, then answer."
QUESTION = "Echo hello, then echo again, then answer 'Answer: hello'."
ECHO = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Return the text unchanged.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}
TEXTS = (
    '<tool_call>\n{"name": "echo", "arguments": {"text": "hello"}}\n</tool_call>',
    '<tool_call>\n{"name": "echo", "arguments": {"text": "again"}}\n</tool_call>',
    "Answer: hello",
)


def make_policy(renderer: Any) -> Any:
    from agentrl.testing import ScriptedPolicy

    stop = renderer.stop_token_ids[0]
    turns = [[*renderer.encode(t), stop] for t in TEXTS]
    return ScriptedPolicy(turns, stop_ids=renderer.stop_token_ids)


# ------------------------------------------------------------------------------------------------ server
async def serve() -> None:
    import agentrl.trainers.gateway.server as server
    from agentrl.chat import ChatRenderer
    from agentrl.models import smollm2_tokenizer
    from agentrl.trainers.gateway import Gateway

    renderer = ChatRenderer(smollm2_tokenizer())
    policy = make_policy(renderer)
    policy.calls = _NoList()  # ScriptedPolicy keeps every prompt; a long benchmark would keep them all
    build = server.build_app
    server.build_app = lambda core, **kw: _Timed(build(core, **kw))  # type: ignore[assignment,return-value]
    async with Gateway(policy, renderer) as gw:
        print(f"URL {gw.url}", flush=True)
        await asyncio.Event().wait()


class _Timed:
    """ASGI wrapper that times each chat request inside the server: from the app receiving it (headers
    parsed) to its last response byte handed to the transport. ``GET /bench/stats`` returns and clears."""

    def __init__(self, app: Any):
        self.app = app
        self.times: list[float] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/bench/stats":
            body = json.dumps(self.times).encode()
            self.times = []
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-length", b"%d" % len(body))],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        t0 = time.perf_counter()
        chat = scope["type"] == "http" and scope["path"].endswith("/chat/completions")

        async def timed(message: Any) -> None:
            await send(message)
            if chat and message["type"] == "http.response.body" and not message.get("more_body"):
                self.times.append(time.perf_counter() - t0)

        await self.app(scope, receive, timed)


class _NoList(list):  # type: ignore[type-arg]
    def append(self, item: Any) -> None:
        self[:] = [item]


# ------------------------------------------------------------------------------------------------ clients
def start() -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


async def session_httpx(http: Any, sid: str, lat: list[float]) -> None:
    messages: list[dict[str, Any]] = start()
    for _ in range(3):
        body = {"model": "p", "messages": messages, "tools": [ECHO], "max_tokens": 64}
        t0 = time.perf_counter()
        r = await http.post(f"/s/{sid}/v1/chat/completions", json=body)
        lat.append(time.perf_counter() - t0)
        msg = r.json()["choices"][0]["message"]
        messages.append(msg)
        if not msg.get("tool_calls"):
            break
        call = msg["tool_calls"][0]
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "hello"})
    r = await http.post(f"/s/{sid}/finish", json={"reward": 1.0})
    assert r.status_code == 200 and r.json()["trajectories"][0]["trainable"], r.text


async def session_openai(client: Any, lat: list[float]) -> None:
    messages: list[Any] = start()
    for _ in range(3):
        t0 = time.perf_counter()
        reply = await client.chat.completions.create(
            model="p", messages=messages, tools=[ECHO], max_tokens=64
        )
        lat.append(time.perf_counter() - t0)
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            break
        messages.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "hello"})


async def round_trips(url: str, n: int) -> dict[str, float]:
    """GET /health: the HTTP round trip alone (same client, same server), the transport's floor."""
    import httpx

    lat = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for _ in range(n):
            t0 = time.perf_counter()
            await http.get("/health")
            lat.append(time.perf_counter() - t0)
    return _stats(lat) | {"n": n}


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(url: str, pid: int, sessions: int, concurrency: int, tag: str) -> dict[str, float]:
    import httpx

    lat: list[float] = []
    limit = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:

        async def one(k: int) -> None:
            async with limit:
                await session_httpx(http, f"{tag}-{k}", lat)

        await http.get("/bench/stats")
        cpu0, w0 = server_cpu(pid), time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(sessions)))
        wall, cpu = time.perf_counter() - w0, server_cpu(pid) - cpu0
        inside = (await http.get("/bench/stats")).json()
    return _stats(lat) | {
        "rps": len(lat) / wall,
        "server_cpu_ms": 1e3 * cpu / len(lat),
        "server_p50": statistics.median(inside) * 1e3,
        "n": len(lat),
    }


async def load_openai(url: str, sessions: int) -> dict[str, float]:
    import openai

    lat: list[float] = []
    for k in range(sessions):
        client = openai.AsyncOpenAI(base_url=f"{url}/s/oa-{k}/v1", api_key="-", max_retries=0)
        await session_openai(client, lat)
        await client.close()
    return _stats(lat) | {"n": len(lat)}


def _stats(lat: list[float]) -> dict[str, float]:
    q = statistics.quantiles(lat, n=100)
    return {"p50": statistics.median(lat) * 1e3, "p90": q[89] * 1e3, "p99": q[98] * 1e3}


# ------------------------------------------------------------------------------------------------ in process
async def direct(renderer: Any, calls: int) -> float:
    from agentrl.protocols import Sampling

    policy = make_policy(renderer)
    ids = list(renderer.render_prompt(_messages()).token_ids)
    t0 = time.perf_counter()
    for _ in range(calls):
        await policy.generate(ids, Sampling(max_new_tokens=64))
        policy.calls.clear()
    return (time.perf_counter() - t0) / calls * 1e3


def _messages() -> list[Any]:
    from agentrl.types import Message

    return [Message("system", SYSTEM), Message("user", QUESTION)]


async def native(renderer: Any, episodes: int) -> float:
    from agentrl.envs import Task, ToolEnv
    from agentrl.rollout import RolloutConfig, run_episode
    from agentrl.testing import EchoTool

    class Echo(ToolEnv):
        def __init__(self) -> None:
            super().__init__([EchoTool()], parser="hermes", system_prompt=SYSTEM)

        def make_task(self, options: dict[str, Any]) -> Task:
            return Task(QUESTION, answer="hello")

    turns = 0
    t0 = time.perf_counter()
    for _ in range(episodes):
        env = Echo()
        traj = await run_episode(env, make_policy(renderer), renderer, RolloutConfig())
        turns += traj.num_turns
    return (time.perf_counter() - t0) / turns * 1e3


# ------------------------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(Path(__file__).parent.parent / "docs/benchmarks/gateway.md"))
    args = ap.parse_args()
    if args.serve:
        asyncio.run(serve())
        return
    scale = 1 if args.quick else 4
    from agentrl.chat import ChatRenderer
    from agentrl.models import smollm2_tokenizer

    renderer = ChatRenderer(smollm2_tokenizer())
    floor = asyncio.run(direct(renderer, 2000))
    native_ms = asyncio.run(native(renderer, 50 * scale))
    proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.match(r"URL (\S+)", line)
        assert m, f"the server did not start: {line!r}"
        url = m.group(1)
        asyncio.run(load(url, proc.pid, 20, 1, "warm"))  # connections, caches, first renders
        rows = {
            "HTTP round trip only: GET /health (httpx)": asyncio.run(round_trips(url, 100 * scale)),
            "gateway, 1 session at a time (httpx)": asyncio.run(load(url, proc.pid, 50 * scale, 1, "seq")),
            "gateway, 1 session at a time (openai client)": asyncio.run(load_openai(url, 25 * scale)),
            "gateway, 16 sessions at once (httpx)": asyncio.run(load(url, proc.pid, 64 * scale, 16, "c16")),
            "gateway, 64 sessions at once (httpx)": asyncio.run(load(url, proc.pid, 128 * scale, 64, "c64")),
        }
    finally:
        proc.kill()
        proc.wait()
    for name, r in rows.items():
        print(f"{name:48s} {json.dumps({k: round(v, 3) for k, v in r.items()})}")
    print(f"direct policy call {floor:.4f} ms; native rollout {native_ms:.3f} ms per turn")

    seq = rows["gateway, 1 session at a time (httpx)"]
    overhead = seq["p50"] - floor
    transport = rows["HTTP round trip only: GET /health (httpx)"]["p50"]
    cpu64 = rows["gateway, 64 sessions at once (httpx)"]["server_cpu_ms"]
    lines = [
        "# Gateway overhead",
        "",
        "`benchmarks/gateway.py`: an instant scripted policy (`agentrl.testing.ScriptedPolicy`) behind the",
        "recording gateway, which runs in its own process with the real SmolLM2 tokenizer and chat template",
        "and audits every trajectory it records. Each session is a 3-turn tool conversation (two echo calls,",
        "an answer) that resends its whole history with every request, then `finish`. Clients talk real HTTP",
        "over loopback. Target (issue 16): <= 2 ms p50 overhead per request on 2 cores.",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; 1-minute load average {os.getloadavg()[0]:.1f} at the end of the run",
        "(other jobs may share the machine).",
        "",
        "| variant | requests | p50 ms | p90 ms | p99 ms | requests / s | in-server p50 ms | server CPU ms"
        " / req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| direct `policy.generate` in process (the floor) | 2000 | {floor:.4f} | | | | | |",
        f"| native Env rollout in process, per model turn | | {native_ms:.3f} | | | | | |",
    ]
    for name, r in rows.items():
        rps = f"{r['rps']:,.0f}" if "rps" in r else ""
        inside = f"{r['server_p50']:.2f}" if "server_p50" in r else ""
        cpu = f"{r['server_cpu_ms']:.2f}" if "server_cpu_ms" in r else ""
        lines.append(
            f"| {name} | {int(r['n'])} | {r['p50']:.2f} | {r['p90']:.2f} | {r['p99']:.2f} | {rps} | {inside} "
            f"| {cpu} |"
        )
    inside = seq["server_p50"]
    verdict = "meets" if inside <= 2.0 else "misses"
    lines += [
        "",
        f"The gateway {verdict} the target: inside the server a request takes {inside:.2f} ms (p50, one",
        "session at a time, the policy instant), from the app receiving it to its last byte handed to the",
        f"socket: {inside / native_ms:.1f}x a native rollout turn measured in the same run "
        f"({native_ms:.2f} ms;",
        "both scale with the shared machine's load). End to end, at the client, a request costs",
        f"{overhead:.2f} ms more than calling the policy directly; the bare HTTP round trip with the same",
        f"client and server (GET /health) is {transport:.2f} ms of that on this machine, and the rest is the",
        "client's own work (building and parsing JSON bodies that grow with the conversation) and",
        "scheduling between the two processes. Under 64 concurrent sessions the server spends",
        f"{cpu64:.2f} ms of CPU per request (the HTTP server, and `finish` with its audit, included):",
        f"one core serves about {1e3 / max(cpu64, 1e-9):,.0f} requests/s, and latency under load is",
        "queueing behind the other sessions' requests on a shared 2-core machine. Per request the server",
        "validates and normalizes the body, compares the messages with the session's previous request,",
        "renders only the new messages (a few template renders), tokenizes the delta with its text- and",
        "token-level checks, and parses the tool calls.",
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
