"""``agentrl replay --reexec`` on compacted (multi-sample) episodes of long-chain-v0 (issue 47, point 3).

A later sample starts from the context the env compacted to, which a fresh ``reset`` cannot reach: replay
re-executes an episode's samples in order through one env. The episodes here are the env's expert runs
(env- and policy-compaction) written by the real rollout, so every sample must replay identically; a wrong
summary recorded by the policy is replayed as recorded; a sample whose earlier samples are not in the file
is reported not re-executable, with its own count and exit status (3), never as a difference.
"""

import asyncio
import json
from pathlib import Path

import pytest

from agentrl import JsonlStore, read_trajectories
from agentrl.envs.long_chain import LongChainEnv, expert_turns
from agentrl.rollout import RolloutConfig
from agentrl.samples import run_samples
from agentrl.testing import ScriptedPolicy
from agentrl.trainers.cli import main as cli_main
from agentrl.types import StopReason, TrajectoryMeta

CFG = RolloutConfig(max_turns=32, max_new_tokens=64, max_total_tokens=4096)


def _episode(renderer, mode: str, seed: int, *, spoil_summary: bool = False):
    kwargs = {"k": 6, "context": mode, "compact_every": 2}
    probe = LongChainEnv(**kwargs)
    asyncio.run(probe.reset(seed=seed))
    turns = expert_turns(probe.numbers, mode, 2)
    if spoil_summary:  # the policy's first summary carries a wrong running sum forward
        i = next(i for i, t in enumerate(turns) if t.startswith("S"))
        head, *rest = turns[i][1:].split()
        turns[i] = "S" + " ".join([str(int(head) + 1), *rest])
    stop = renderer.stop_token_ids
    policy = ScriptedPolicy([[*renderer.encode(t), stop[0]] for t in turns], stop_ids=stop)
    meta = TrajectoryMeta(env_id="long-chain-v0")
    return asyncio.run(run_samples(LongChainEnv(**kwargs), policy, renderer, CFG, seed=seed, meta=meta))


def _write(path: Path, trajs) -> Path:
    with JsonlStore(path) as store:
        for t in trajs:
            store.write(t)
    return path


def _replay(path: Path, mode: str, capsys, *extra: str) -> tuple[int, str]:
    kwargs = json.dumps({"k": 6, "context": mode, "compact_every": 2})
    capsys.readouterr()
    rc = cli_main(["replay", str(path), "--reexec", "--env-kwargs", kwargs, *extra])
    return rc, capsys.readouterr().out


@pytest.mark.parametrize("mode", ["env-compaction", "policy-compaction"])
def test_a_compacted_episode_replays_sample_by_sample(renderer, tmp_path, capsys, mode):
    samples = _episode(renderer, mode, seed=3)
    assert [s.stop_reason for s in samples] == [StopReason.COMPACTED] * 2 + [StopReason.TERMINATED]
    path = _write(tmp_path / "t.jsonl", samples)
    rc, out = _replay(path, mode, capsys)
    assert rc == 0, out
    assert (
        "reexec: 3 of 3 trajectories replayed identically, 0 differed or failed, 0 not re-executable" in out
    )
    assert "1 compacted episode(s) were re-executed sample by sample" in out
    # Only the last sample asked for: its earlier samples still come from the file, so it replays too.
    rc, out = _replay(path, mode, capsys, "--show", "2")
    assert rc == 0 and "reexec: 1 of 1 trajectories replayed identically" in out, out


def test_a_wrong_policy_summary_is_replayed_as_recorded(renderer, tmp_path, capsys):
    samples = _episode(renderer, "policy-compaction", seed=3, spoil_summary=True)
    right = _episode(renderer, "policy-compaction", seed=3)
    assert samples[1].messages[0] != right[1].messages[0]  # the next sample starts from the wrong summary
    rc, out = _replay(_write(tmp_path / "t.jsonl", samples), "policy-compaction", capsys, "--rescore")
    assert rc == 0, out
    assert f"reexec: {len(samples)} of {len(samples)} trajectories replayed identically" in out


def test_a_sample_without_its_earlier_samples_is_not_re_executable(renderer, tmp_path, capsys):
    samples = _episode(renderer, "env-compaction", seed=4)
    path = _write(tmp_path / "t.jsonl", samples[1:])  # sample 0 is not in the file
    rc, out = _replay(path, "env-compaction", capsys)
    assert rc == 3, out
    assert "NOT RE-EXECUTABLE: sample 1 of episode" in out and "needs its samples 0..0" in out
    assert (
        "reexec: 0 of 2 trajectories replayed identically, 0 differed or failed, 2 not re-executable" in out
    )
    # A real difference still wins: exit 1.
    (first,) = [t for t in read_trajectories(_write(tmp_path / "u.jsonl", samples[:1]))]
    rc, out = _replay(tmp_path / "u.jsonl", "env-compaction", capsys)
    assert rc == 0, out
    kwargs = json.dumps({"k": 7, "context": "env-compaction", "compact_every": 2})  # another task
    assert cli_main(["replay", str(tmp_path / "t.jsonl"), "--reexec", "--env-kwargs", kwargs]) == 3
    both = _write(tmp_path / "v.jsonl", [*samples[1:], first])
    assert cli_main(["replay", str(both), "--reexec", "--env-kwargs", kwargs]) == 1


def test_a_bare_file_without_env_kwargs_says_to_pass_them(renderer, tmp_path, capsys):
    # Issue 47: the env was built with settings in Python; a bare file does not record them.
    path = _write(tmp_path / "t.jsonl", _episode(renderer, "env-compaction", seed=3))
    capsys.readouterr()
    assert cli_main(["replay", str(path), "--reexec"]) == 1  # long-chain-v0's defaults: another task
    out = capsys.readouterr().out
    assert "records the env's id but not the arguments it was built with" in out
    assert "pass them: --env-kwargs" in out
    rc, out = _replay(path, "env-compaction", capsys)  # with them: identical, and no note
    assert rc == 0 and "--env-kwargs" not in out
