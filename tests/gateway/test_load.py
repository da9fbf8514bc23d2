"""The gateway-load invariants (``benchmarks/gateway_load.py``, ``benchmarks/gateway.py --load``) at a small
scale: 32 sessions at once over real HTTP, a quarter disconnecting mid-stream and half sending a body that is
not JSON, then a normal round. Every finished session is one trainable trajectory with only its own word
(none lost or mixed), every cut-off session is recorded as cancelled by the idle timeout, every session
refused at its first request is nowhere, the server keeps serving, and no session is left open."""

import sys
from pathlib import Path

import httpx

from agentrl import JsonlStore
from agentrl.trainers.gateway import Gateway

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gateway_load


async def test_sessions_under_load_with_disconnects_and_malformed_bodies_are_each_accounted_for(
    renderer, tmp_path
):
    store = JsonlStore(tmp_path / "t.jsonl")
    policy = gateway_load.make_policy(renderer)
    async with Gateway(policy, renderer, store=store, session_timeout=3.0) as gw:
        faulty, stats = await gateway_load.run_round(gw.url, "r1", 32, faulty=True)
        normal, _ = await gateway_load.run_round(gw.url, "r2", 16, faulty=False)
        assert await gateway_load.settle(gw.url, 20) == 0
        async with httpx.AsyncClient(base_url=gw.url) as http:
            assert (await http.get("/health")).json() == {"ok": True, "open_sessions": 0}
    store.close()
    verdict = gateway_load.check(faulty + normal, tmp_path / "t.jsonl", renderer.tokenizer)
    assert verdict["problems"] == []
    assert verdict["kinds"] == {"finished": 8 + 16, "cancelled": 16, "refused": 8}
    assert stats["turns"] == 8 * 3 + 8 * 1 + 8 * 1  # normal sessions 3 turns; disconnect and malformed-mid 1


async def test_the_load_check_catches_a_mixed_and_a_lost_session(renderer, tmp_path):
    store = JsonlStore(tmp_path / "t.jsonl")
    async with Gateway(gateway_load.make_policy(renderer), renderer, store=store) as gw:
        outs, _ = await gateway_load.run_round(gw.url, "r1", 2, faulty=False)
    store.close()
    assert gateway_load.check(outs, tmp_path / "t.jsonl", renderer.tokenizer)["problems"] == []
    swapped = [outs[0], gateway_load.Outcome(outs[1].sid, outs[0].word, "normal", outs[1].statuses, True)]
    assert any(
        "mixed" in p
        for p in gateway_load.check(swapped, tmp_path / "t.jsonl", renderer.tokenizer)["problems"]
    )
    ghost = [*outs, gateway_load.Outcome("r1-9", "r1w0009x", "normal", [200], True)]
    assert any(
        "lost" in p for p in gateway_load.check(ghost, tmp_path / "t.jsonl", renderer.tokenizer)["problems"]
    )
