"""Live training (``agentrl gateway --train``): sessions that arrive from outside become training groups of
the one training loop. A group is ``group_size`` rewarded sessions of one task id; a session whose reward
never comes is dropped with the loop's reason, and so is a group over the staleness bound."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from agentrl import read_trajectories
from agentrl.audit import audit_trajectory
from agentrl.episode import RolloutConfig
from agentrl.metrics import read_metrics
from agentrl.staleness import DroppedGroup, StepOutcome
from agentrl.trainers.cli import main
from agentrl.trainers.gateway import GatewayCore
from agentrl.trainers.gateway.cli import ServeConfig
from agentrl.trainers.gateway.live import (
    LEDGER_FILE,
    SESSIONS_FILE,
    LiveGroups,
    live_source,
    live_train_config,
)
from agentrl.trainers.local import local_runtime
from agentrl.trainers.loop import STALE_DROP, UNREWARDED_DROP
from agentrl.trainers.train import train
from agentrl.trainers.train_setup import TrainConfig
from agentrl.types import TrajectoryMeta

from .helpers import START, scripted
from .test_cli import AGENTRL, replay_in_process, wait_for_url


async def test_live_groups_form_by_task_and_hand_unrewarded_sessions_on_alone(renderer, tmp_path):
    live = LiveGroups(2, ledger=tmp_path / LEDGER_FILE)
    core = GatewayCore(
        scripted(renderer, ["a", "b", "c", "d"]), renderer, reward_deadline=5.0, on_session=live.add
    )  # type: ignore[arg-type]
    for sid in ("a1", "b1", "a2", "u"):
        await core.chat(sid, {"model": "m", "messages": START})
    await core.finish("a1", 1.0, {"task_id": "A"})
    await core.finish("b1", 0.0, {"task_id": "B"})
    await core.end("u", {"task_id": "A"})
    assert live.waiting == {"A": 1, "B": 1}
    await core.end("a2", {"task_id": "A"})
    await core.reward("a2", 0.0)  # the reward after the session: the group of A is complete
    await core.expire_rewards(now=asyncio.get_running_loop().time() + 6)  # u: never rewarded
    assert live.waiting == {"B": 1}
    events = live.run_groups(seeds=(7, 8), group_size=2, meta=TrajectoryMeta(env_id="x", step=3))
    done = [e async for e in events]
    first, second = done[1].group, done[2].group
    assert first is not None and second is not None and done[0].group is None
    assert [t.meta.extra["session_id"] for t in first] == ["a1", "a2"] and first.rewards == (1.0, 0.0)
    assert {(t.meta.step, t.meta.group_id, t.meta.task_id) for t in first} == {(3, "live-s3-7", "A")}
    assert first.usable() is first and second.usable() is None  # u is an infrastructure failure alone
    live.record(StepOutcome(3, (7,), (DroppedGroup(8, UNREWARDED_DROP),)))
    rows = [json.loads(line) for line in (tmp_path / LEDGER_FILE).read_text().splitlines()]
    assert rows == [
        {"step": 3, "group_id": "live-s3-7", "task_id": "A", "sessions": ["a1", "a2"], "trained": True,
         "reason": None},
        {"step": 3, "group_id": "live-s3-8", "task_id": "A", "sessions": ["u"], "trained": False,
         "reason": UNREWARDED_DROP},
    ]  # fmt: skip


def test_the_gateway_command_says_which_settings_need_train(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["gateway", "--out", out, "--steps", "3", "--learner.lr", "1e-5"]) == 2
    assert (
        "--learner.lr, --steps: training settings, which apply only with --train" in capsys.readouterr().err
    )
    assert main(["gateway", "--out", out, "--train", "true"]) == 2
    assert "--train needs --max-staleness >= 1" in capsys.readouterr().err
    assert (
        main(["gateway", "--out", out, "--train", "true", "--max-staleness", "1", "--max-new-tokens", "8"])
        == 2
    )
    assert "pass --rollout.max-new-tokens" in capsys.readouterr().err
    assert (
        main(["gateway", "--out", out, "--train", "true", "--max-staleness", "1", "--agent", "a.py:f"]) == 2
    )
    assert "--train trains on sessions that arrive from outside" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything was made


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
async def test_outside_sessions_with_delayed_rewards_train(tmp_path: Path, renderer):
    """Three steps, one group of two sessions each: step 0 trains a group whose second reward came after its
    session (openai chat + anthropic Messages); step 1 gets a session never rewarded (Responses API) and
    drops it; step 2 gets a group one of whose sessions was sampled before step 0 trained: over
    --max-staleness 1, dropped."""
    out = tmp_path / "live"
    serve = ServeConfig(model="tiny", out=str(out), port=free_port(), reward_deadline=2.0, log_requests=False)
    base = TrainConfig(
        model="tiny",
        out=str(out),
        steps=3,
        group_size=2,
        groups_per_step=1,
        max_staleness=1,
        progress=False,
        rollout=RolloutConfig(max_new_tokens=8, max_total_tokens=1024, max_turns=4),
    )
    cfg = live_train_config(serve, set(), base)
    assert cfg.eval.tasks == 0

    def runtime(c, r):
        return local_runtime(c, r, source=live_source(serve, None, r.path))

    url = f"http://127.0.0.1:{serve.port}"

    async def drive() -> None:
        async with httpx.AsyncClient(base_url=url) as http:
            for _ in range(600):
                try:
                    if (await http.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)

            async def chat(sid: str) -> None:
                async with openai.AsyncOpenAI(base_url=f"{url}/s/{sid}/v1", api_key="k", max_retries=0) as c:
                    await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])

            async def finish(sid: str, body: dict) -> None:
                r = await http.post(f"/s/{sid}/finish", json=body)
                assert r.status_code == 200, r.text

            await chat("a1")
            await finish("a1", {"reward": 1.0, "info": {"task_id": "t1"}})
            await chat("b1")  # sampled by version 0; its group mate comes after two updates
            await finish("b1", {"reward": 0.0, "info": {"task_id": "t3"}})
            async with anthropic.AsyncAnthropic(base_url=f"{url}/s/a2", api_key="k", max_retries=0) as a:
                await a.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
            await finish("a2", {"info": {"task_id": "t1"}})  # the reward comes later...
            r = await http.post("/s/a2/reward", json={"reward": 0.0})  # ...now: group t1 goes to step 0
            assert r.status_code == 200, r.text
            async with openai.AsyncOpenAI(base_url=f"{url}/s/u/v1", api_key="k", max_retries=0) as c:
                await c.responses.create(model="m", input="Hi", max_output_tokens=8)
            await finish("u", {"info": {"task_id": "t2"}})  # never rewarded: step 1 gets it and drops it
            for _ in range(1200):  # until step 1 is logged: the learner is at version 2
                if (out / "metrics.jsonl").is_file() and len(read_metrics(out)) >= 2:
                    break
                await asyncio.sleep(0.1)
            await chat("b2")
            await finish("b2", {"reward": 1.0, "info": {"task_id": "t3"}})

    run_dir, _ = await asyncio.wait_for(asyncio.gather(train(cfg, runtime=runtime), drive()), timeout=300)
    assert run_dir == out
    ledger = [json.loads(line) for line in (out / LEDGER_FILE).read_text().splitlines()]
    assert [(r["step"], sorted(r["sessions"]), r["trained"], r["reason"]) for r in ledger] == [
        (0, ["a1", "a2"], True, None),
        (1, ["u"], False, UNREWARDED_DROP),
        (2, ["b1", "b2"], False, STALE_DROP),
    ]
    rows = read_metrics(out)
    # the staleness bound drops at admission (counted there); the unrewarded session is judged unusable
    assert [(r["step"], r["async/groups_dropped"]) for r in rows] == [(0, 0), (1, 0), (2, 1)]
    sessions = list(read_trajectories(out / SESSIONS_FILE))
    trained = list(read_trajectories(out / "trajectories.jsonl"))
    assert sorted(t.meta.extra["session_id"] for t in sessions) == ["a1", "a2", "b1", "b2", "u"]
    assert {t.meta.extra["session_id"]: t.meta.step for t in trained} == {
        "a1": 0, "a2": 0, "u": 1, "b1": 2, "b2": 2
    }  # fmt: skip
    by_sid = {t.meta.extra["session_id"]: t for t in trained}
    assert by_sid["b1"].min_policy_version == 0 and by_sid["b2"].min_policy_version == 2
    assert by_sid["a2"].reward == 0.0 and by_sid["u"].infra_failure
    for t in trained:
        audit_trajectory(t, renderer)
    assert (out / "checkpoints").is_dir()


@pytest.mark.slow
def test_the_gateway_command_trains_on_outside_sessions(tmp_path, capsys):
    """``agentrl gateway --train true``: two outside sessions of one task (one rewarded after it ended) are
    one step's group; the run ends after --steps and ``agentrl replay --check`` audits what it trained on."""
    out = tmp_path / "live"
    proc = subprocess.Popen(
        [
            *AGENTRL,
            "gateway",
            "--train",
            "true",
            "--model",
            "tiny",
            "--out",
            str(out),
            "--port",
            "0",
            "--steps",
            "1",
            "--group-size",
            "2",
            "--groups-per-step",
            "1",
            "--max-staleness",
            "1",
            "--rollout.max-new-tokens",
            "8",
            "--no-progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = wait_for_url(proc)
        for sid in ("first", "second"):
            with openai.OpenAI(base_url=f"{url}/s/{sid}/v1", api_key="k", max_retries=0) as client:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
        assert httpx.post(f"{url}/s/first/finish", json={"reward": 1.0, "info": {"task_id": "hi"}}).is_success
        assert httpx.post(f"{url}/s/second/finish", json={"info": {"task_id": "hi"}}).is_success
        assert httpx.post(f"{url}/s/second/reward", json={"reward": 0.0}).is_success
        stdout, stderr = proc.communicate(timeout=300)  # one step, then it stops by itself
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    assert f"done: {out}" in stdout
    (row,) = [json.loads(line) for line in (out / LEDGER_FILE).read_text().splitlines()]
    assert (row["step"], sorted(row["sessions"]), row["trained"]) == (0, ["first", "second"], True)
    assert [r["step"] for r in read_metrics(out)] == [0]
    code, check = replay_in_process(capsys, str(out), "--check")  # the run was written by the gateway process
    assert code == 0 and "2 of 2 trajectories consistent" in check, check
