"""The vLLM policies' own logic, without vLLM: the worker extension's checksum equals the learner's, weight
files keep tied parameters, and every error path of the HTTP transport is a clear PolicyError/ConfigError
that keeps the old version. The error paths run against a small local server answering vLLM's routes the way
vLLM does when it fails; the happy path runs against the real ``vllm serve`` in test_vllm_server.py."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch

from agentrl.errors import ConfigError, PolicyError
from agentrl.policies.vllm_server import VLLMServerPolicy, server_command
from agentrl.policies.vllm_weights import write_safetensors
from agentrl.policies.vllm_worker import AgentRLWorkerExtension, checksum
from agentrl.protocols import UpdatablePolicy, WeightUpdate
from agentrl.weights import weights_checksum


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(7, 4, generator=g)
    return {
        "model.embed_tokens.weight": emb,
        "lm_head.weight": emb,  # tied, as in SmolLM2
        "model.norm.weight": torch.randn(4, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(4, 4, generator=g).t(),  # not contiguous
    }


def test_the_worker_checksum_is_the_learners():
    w = _weights()
    assert checksum(w.items()) == weights_checksum(w)
    w2 = dict(w, **{"model.norm.weight": w["model.norm.weight"].float()})
    assert checksum(w2.items()) != checksum(w.items())  # dtype counts, on both sides alike
    assert checksum(w2.items()) == weights_checksum(w2)


def test_a_weight_file_keeps_tied_names_and_the_checksum(tmp_path):
    from safetensors.torch import load_file

    w = _weights()
    size = write_safetensors(w, tmp_path / "w.safetensors")
    back = load_file(str(tmp_path / "w.safetensors"))
    assert set(back) == set(w) and size == (tmp_path / "w.safetensors").stat().st_size
    assert weights_checksum(back) == weights_checksum(w)


class _Worker(AgentRLWorkerExtension):
    """vLLM's worker as the extension sees it: ``model_runner.model_config.dtype`` and ``reload_weights``."""

    def __init__(self, dtype: torch.dtype):
        self.model_runner = type("Runner", (), {"model_config": type("Cfg", (), {"dtype": dtype})()})()
        self.loaded: dict[str, torch.Tensor] = {}

    def reload_weights(self, weights_iterator: Any) -> None:
        self.loaded = dict(weights_iterator)


def test_the_extension_loads_what_the_file_holds_in_the_engine_dtype(tmp_path):
    w = {k: v.float() for k, v in _weights().items()}
    write_safetensors(w, tmp_path / "w.safetensors")
    worker = _Worker(torch.float32)
    assert worker.agentrl_weights_checksum() == ""
    digest = worker.agentrl_load_weights(str(tmp_path / "w.safetensors"))
    assert digest == weights_checksum(w) == worker.agentrl_weights_checksum()
    assert set(worker.loaded) == set(w)
    # An engine serving bf16 reports the checksum of bf16 tensors: not the fp32 learner's, so the push fails.
    assert _Worker(torch.bfloat16).agentrl_load_weights(str(tmp_path / "w.safetensors")) != digest


def test_server_command_links_only_the_extension(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    argv, env = server_command(model, python="/venv/bin/python", port=9, extension_dir=tmp_path / "ext")
    assert sorted(p.name for p in (tmp_path / "ext").iterdir()) == ["agentrl_vllm_worker.py"]
    assert env["PYTHONPATH"] == str(tmp_path / "ext") and env["VLLM_SERVER_DEV_MODE"] == "1"
    joined = " ".join(argv)
    for flag in ("--logprobs-mode processed_logprobs", "--generation-config vllm", "--host 127.0.0.1"):
        assert flag in joined
    assert "agentrl_vllm_worker.AgentRLWorkerExtension" in joined
    with pytest.raises(ConfigError, match="local model folder"):
        server_command(tmp_path / "missing")


class _FakeVLLM:
    """Answers vLLM's routes like a failing or misconfigured server; records the calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.rpc_status, self.rpc_results = 200, ["0" * 64]
        self.dev_mode = True
        self.logprobs_mode = "processed_logprobs"
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.calls.append(self.path.split("?")[0])
                if not fake.dev_mode:
                    return self._send(404, {"detail": "Not Found"})
                cfg = {
                    "model_config": {"logprobs_mode": fake.logprobs_mode, "generation_config": "auto"},
                    "parallel_config": {"worker_extension_cls": ""},
                }
                self._send(200, {"vllm_config": cfg})

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                path = self.path.split("?")[0]
                fake.calls.append(path)
                if not fake.dev_mode:
                    return self._send(404, {"detail": "Not Found"})
                if path == "/collective_rpc":
                    if fake.rpc_status != 200:
                        return self._send(fake.rpc_status, {"error": "AttributeError: agentrl_load_weights"})
                    return self._send(200, {"results": fake.rpc_results})
                self._send(200, {})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_vllm():
    server = _FakeVLLM()
    yield server
    server.close()


def _policy(url: str, tmp_path, version: int = 1) -> VLLMServerPolicy:
    return VLLMServerPolicy(url + "/v1", "m", stop_token_ids=(2,), weights_dir=tmp_path, version=version)


async def test_a_checksum_mismatch_fails_the_push_and_keeps_the_version(fake_vllm, tmp_path):
    policy = _policy(fake_vllm.url, tmp_path)
    assert isinstance(policy, UpdatablePolicy)
    with pytest.raises(PolicyError, match="checksum"):
        await policy.load_weights(WeightUpdate(2, _weights()))
    assert policy.version == 1
    # Paused, loaded, and resumed even though the load failed; the version was never recorded.
    assert fake_vllm.calls == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/resume"]
    assert list(tmp_path.iterdir()) == []  # the weight file is removed either way
    await policy.aclose()


async def test_a_server_without_dev_routes_or_extension_is_a_clear_error(fake_vllm, tmp_path):
    policy = _policy(fake_vllm.url, tmp_path)
    fake_vllm.dev_mode = False
    with pytest.raises(PolicyError, match="VLLM_SERVER_DEV_MODE=1"):
        await policy.load_weights(WeightUpdate(2, _weights()))
    fake_vllm.dev_mode, fake_vllm.rpc_status = True, 500
    with pytest.raises(PolicyError, match=r"500.*agentrl_load_weights"):
        await policy.load_weights(WeightUpdate(2, _weights()))
    assert policy.version == 1 and fake_vllm.calls[-1] == "/resume"
    await policy.aclose()


async def test_a_stale_update_is_refused_before_any_request(fake_vllm, tmp_path):
    policy = _policy(fake_vllm.url, tmp_path, version=5)
    with pytest.raises(ConfigError, match="stale"):
        await policy.load_weights(WeightUpdate(4, _weights()))
    assert fake_vllm.calls == []
    await policy.aclose()


async def test_connect_names_every_unfaithful_setting(fake_vllm, tmp_path):
    fake_vllm.logprobs_mode = "raw_logprobs"
    policy = _policy(fake_vllm.url, tmp_path)
    with pytest.raises(ConfigError) as e:
        await policy.connect()
    msg = str(e.value)
    assert "--logprobs-mode processed_logprobs" in msg and "--generation-config vllm" in msg
    assert "worker extension" in msg
    await policy.aclose()


async def test_an_unreachable_server_is_a_policy_error(tmp_path):
    policy = VLLMServerPolicy("http://127.0.0.1:9", "m", stop_token_ids=(2,), weights_dir=tmp_path)
    with pytest.raises(PolicyError, match=r"127\.0\.0\.1:9"):
        await policy.connect()
    with pytest.raises(ConfigError, match="http"):
        VLLMServerPolicy("127.0.0.1:8000", "m", stop_token_ids=(2,))
    with pytest.raises(ConfigError, match="stop_token_ids"):
        VLLMServerPolicy("http://127.0.0.1:8000", "m", stop_token_ids=())
    await policy.aclose()


async def test_generations_wait_for_a_running_update_and_updates_take_turns():
    import asyncio

    from agentrl.policies.vllm_weights import UpdateGate

    gate, log = UpdateGate(), []

    async def update(name: str) -> None:
        async with gate.updating():
            log.append(f"{name} start")
            await asyncio.sleep(0.05)
            log.append(f"{name} end")

    async def generation() -> None:
        await asyncio.sleep(0.01)  # starts while the first update runs
        await gate.wait()
        log.append("generate")

    await asyncio.gather(update("a"), update("b"), generation())
    assert log[:2] == ["a start", "a end"] and log.index("generate") >= 2
    assert log.index("b end") == log.index("b start") + 1
    await gate.wait()  # idle again: returns at once
