"""OpenAIPolicy against a local OpenAI-compatible /v1/completions server (vLLM's response shape) that
serves the same tiny model on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import agentrl
from agentrl.audit import audit_trajectory, recompute_logprobs
from agentrl.errors import PolicyError
from agentrl.policies import HFPolicy, OpenAIPolicy
from agentrl.protocols import Policy, Sampling
from agentrl.rollout import RolloutConfig, run_group
from agentrl.types import StopReason


class _Server:
    """A vLLM-like completions endpoint. ``mode`` injects the faults a real engine can have."""

    def __init__(self, backend: HFPolicy, tok):
        self.backend, self.tok = backend, tok
        self.mode = "ok"
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                status, payload = server.complete(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def complete(self, body):
        if self.mode == "500":
            return 500, {"error": {"message": "engine died", "type": "internal"}}
        s = Sampling(
            max_new_tokens=body["max_tokens"],
            temperature=body["temperature"],
            top_p=body["top_p"],
            seed=body.get("seed"),
        )
        g = self.backend.generate_batch_sync([body["prompt"]], [s])[0]
        ids = list(g.token_ids)
        text = self.tok.decode(ids, skip_special_tokens=False)
        if self.mode == "wrong-ids":  # the ids disagree with the text the engine produced
            ids[0] = (ids[0] + 1) % 1000
        choice = {
            "index": 0,
            "text": text,
            "finish_reason": g.finish_reason.value,
            "logprobs": {
                "tokens": [f"token_id:{t}" for t in ids],
                "token_logprobs": list(g.logprobs),
                "text_offset": [0] * len(ids),
                "top_logprobs": None,
            },
        }
        if self.mode != "no-token-ids":
            choice["token_ids"] = ids
        else:
            choice["logprobs"]["tokens"] = [self.tok.decode([t]) for t in ids]
        return 200, {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 0,
            "model": body["model"],
            "choices": [choice],
            "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids), "total_tokens": 0},
        }

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(model, tok, renderer):
    s = _Server(HFPolicy(model, tok, stop_token_ids=renderer.stop_token_ids, seed=0), tok)
    yield s
    s.close()


def _policy(server, tok, renderer, **kw):
    return OpenAIPolicy(
        server.url, "tiny", stop_token_ids=renderer.stop_token_ids, tokenizer=tok, max_retries=0, **kw
    )


async def test_episodes_through_the_server_are_token_faithful(server, model, tok, renderer):
    policy = _policy(server, tok, renderer)
    assert isinstance(policy, Policy)
    cfg = RolloutConfig(max_turns=3, max_new_tokens=16, temperature=0.8, audit=True)
    trajs = await run_group("guess-number-v0", policy, renderer, cfg, group_size=2, seed=3)
    for traj in trajs:
        assert not traj.infra_failure
        audit_trajectory(traj, renderer)
        ref = recompute_logprobs(model, traj.token_ids, temperature=0.8)
        for i, lp in enumerate(traj.logprobs):
            if lp is not None:
                assert abs(ref[i] - lp) < 1e-4
    req = server.requests[0]
    assert isinstance(req["prompt"], list) and all(isinstance(t, int) for t in req["prompt"])
    assert req["return_token_ids"] is True and req["stop_token_ids"] == list(renderer.stop_token_ids)
    assert req["logprobs"] == 1 and req["skip_special_tokens"] is False


async def test_version_is_reported(server, tok, renderer):
    policy = _policy(server, tok, renderer, version=4)
    assert (await policy.generate(renderer.encode("hi"), Sampling(max_new_tokens=3))).policy_version == 4
    policy.set_version(5)
    assert (await policy.generate(renderer.encode("hi"), Sampling(max_new_tokens=3))).policy_version == 5


@pytest.mark.parametrize(
    "mode, message",
    [
        ("wrong-ids", "does not match its token ids"),
        ("no-token-ids", "no token ids"),
        ("500", "failed"),
    ],
)
async def test_server_faults_are_policy_errors(server, tok, renderer, mode, message):
    """Pitfall §15.5: ids that disagree with the engine's own text are rejected, never trained on; and a
    server without token ids is refused rather than re-tokenizing its text (§15.1)."""
    server.mode = mode
    policy = _policy(server, tok, renderer)
    with pytest.raises(PolicyError, match=message):
        await policy.generate(renderer.encode("hi"), Sampling(max_new_tokens=4))
    cfg = RolloutConfig(max_new_tokens=4, audit=True)
    traj = (await run_group("exact-answer-v0", policy, renderer, cfg, group_size=1, seed=0))[0]
    assert traj.stop_reason is StopReason.POLICY_ERROR and traj.infra_failure


async def test_unreachable_server(tok, renderer):
    policy = OpenAIPolicy(
        "http://127.0.0.1:9/v1", "tiny", stop_token_ids=renderer.stop_token_ids, max_retries=0, timeout=2
    )
    with pytest.raises(PolicyError):
        await policy.generate([1, 2, 3], Sampling(max_new_tokens=2))
    traj = (await run_group("exact-answer-v0", policy, renderer, RolloutConfig(), group_size=1, seed=0))[0]
    assert traj.infra_failure and agentrl.StopReason.POLICY_ERROR is traj.stop_reason
