"""The gateway's optional API key (issue #32): requests need ``Authorization: Bearer <key>`` (the header the
``openai`` client sends for its ``api_key``), 401 otherwise; a non-loopback host without a key is refused
before anything binds. Also the per-request log line and the finish body's split reasons. Every server here
listens on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess

import httpx
import openai
import pytest

from agentrl.config import config_from_args
from agentrl.errors import ConfigError
from agentrl.trainers.cli import build_parser, main
from agentrl.trainers.gateway import Gateway
from agentrl.trainers.gateway.cli import ServeConfig, serve
from agentrl.trainers.gateway.server import check_exposure, is_loopback

from .helpers import START, ask, scripted
from .test_cli import AGENTRL, wait_for_url


async def test_a_key_is_required_when_set(renderer):
    async with Gateway(scripted(renderer, ("Answer: 1", "Answer: 2")), renderer, api_key="s3cret") as gw:
        url = gw.base_url("a")
        async with httpx.AsyncClient() as h:
            body = {"model": "m", "messages": START}
            r = await h.post(f"{url}/chat/completions", json=body)
            assert r.status_code == 401 and "no Authorization header" in r.json()["error"]["message"]
            r = await h.post(f"{url}/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert (await h.get(f"{url}/models")).status_code == 401
            assert (await h.post(f"{gw.url}/s/a/finish", json={"reward": 1.0})).status_code == 401
            assert (await h.get(f"{gw.url}/health")).status_code == 200  # no session data there
        wrong = openai.AsyncOpenAI(base_url=url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await ask(wrong, START)
        await wrong.close()
        right = openai.AsyncOpenAI(base_url=url, api_key="s3cret", max_retries=0)
        msg, _ = await ask(right, START)
        await right.close()
        assert msg["content"] == "Answer: 1"
        async with httpx.AsyncClient(headers={"Authorization": "Bearer s3cret"}) as h:
            r = await h.post(f"{gw.url}/s/a/finish", json={"reward": 1.0})
        assert r.status_code == 200
        (t,) = r.json()["trajectories"]
        assert (t["segment"], t["segment_end"]) == (0, "finish")


def test_non_loopback_hosts_need_a_key_or_an_explicit_flag():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("my-host")
    check_exposure("127.0.0.1", None, allow_unauthenticated=False)
    check_exposure("0.0.0.0", "key", allow_unauthenticated=False)
    check_exposure("0.0.0.0", None, allow_unauthenticated=True)
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        with pytest.raises(ConfigError, match="--api-key"):
            check_exposure(host, None, allow_unauthenticated=False)
    argv = ["gateway", "--out", "x", "--host", "0.0.0.0", "--allow-unauthenticated", "true", "--api-key", "k"]
    cfg = config_from_args(ServeConfig, build_parser().parse_args(argv))  # the flags as documented
    assert (cfg.allow_unauthenticated, cfg.api_key, cfg.log_requests) == (True, "k", True)
    ns = build_parser().parse_args(["gateway", "--out", "x", "--no-log-requests"])
    assert config_from_args(ServeConfig, ns).log_requests is False


def test_the_gateway_refuses_an_unauthenticated_public_host_before_binding(renderer, tmp_path, capsys):
    # Raised by the constructor: no socket exists yet.
    with pytest.raises(ConfigError, match="AGENTRL_GATEWAY_API_KEY"):
        Gateway(scripted(renderer, ("x",)), renderer, host="0.0.0.0", port=0)
    out = tmp_path / "gw"
    assert main(["gateway", "--model", "tiny", "--out", str(out), "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "--allow-unauthenticated true" in capsys.readouterr().err
    assert not out.exists()  # refused before the model was loaded and anything was written


async def test_serve_with_api_key_flag_logs_each_request(tmp_path, capsys):
    out = tmp_path / "gw"
    argv = ["gateway", "--model", "tiny", "--out", str(out), "--port", "0", "--api-key", "flag-key"]
    argv += ["--max-new-tokens", "4"]
    cfg = config_from_args(ServeConfig, build_parser().parse_args(argv))
    ready, stop = asyncio.Event(), asyncio.Event()
    server = asyncio.ensure_future(serve(cfg, ready=ready, stop=stop))
    await asyncio.wait_for(ready.wait(), 120)
    url = re.search(r"at (http://127\.0\.0\.1:\d+);", capsys.readouterr().out)
    assert url is not None
    try:
        async with httpx.AsyncClient() as h:
            base = f"{url.group(1)}/s/one/v1/chat/completions"
            body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
            assert (await h.post(base, json=body)).status_code == 401
            r = await h.post(base, json=body, headers={"Authorization": "Bearer flag-key"})
            assert r.status_code == 200
    finally:
        stop.set()
        await server
    err = capsys.readouterr().err
    assert re.search(r"gateway: session one 200 prompt_tokens=\d+ completion_tokens=\d+ finish=\w+", err)
    assert re.search(r"latency=\d+\.\d\ds in_flight=1", err)
    assert "flag-key" not in (out / "config.json").read_text()  # the secret stays out of the run folder
    assert json.loads((out / "config.json").read_text())["api_key"] is None


@pytest.mark.slow
def test_the_key_from_the_environment(tmp_path):
    env = {**os.environ, "AGENTRL_GATEWAY_API_KEY": "env-key"}
    cmd = [*AGENTRL, "gateway", "--model", "tiny", "--out", str(tmp_path / "gw"), "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = wait_for_url(proc)
        with openai.OpenAI(base_url=f"{url}/s/x/v1", api_key="env-key", max_retries=0) as client:
            assert client.models.list().data[0].id == "agentrl-policy"
        r = httpx.get(f"{url}/s/x/v1/models", headers={"Authorization": "Bearer other"})
        assert r.status_code == 401
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "stopped" in stdout
