"""bfcl-multi-turn-v0 against the real bfcl-eval wheel: BFCL's ground truth passes BFCL's checker through
the env, wrong episodes fail it, and nothing the model writes is executed as code, in any tool-call format."""

from __future__ import annotations

import builtins
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("bfcl_eval")

import agentrl
from agentrl import Action, ToolStatus
from agentrl.envs import bfcl_data
from agentrl.envs.bfcl import FORMATS, BFCLMultiTurnEnv, render_calls
from agentrl.errors import ConfigError

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
# The one task whose ground truth fails in every category, explained in docs/environments.md: BFCL's
# ground truth calls close_ticket(ticket_id='ticket_001') where BFCL's own doc types ticket_id as an
# integer; the env checks arguments against the doc, so that call is refused and the state differs.
KNOWN_FAILURES = {f"multi_turn_{c}_173" for c in CATEGORIES}


async def play(env: BFCLMultiTurnEnv, actions: Sequence[str]) -> tuple[float, dict[str, Any], list[Any]]:
    """Step through ``actions`` until the episode ends; (total reward, last info, every tool record)."""
    total, info, records = 0.0, {}, []
    for text in actions:
        res = await env.step(Action(text=text))
        total += res.reward
        records += list(res.tool_calls)
        info = dict(res.info)
        if res.terminated or res.truncated:
            return total, info, records
    raise AssertionError(f"the episode did not end after {len(actions)} actions")


async def ground_truth_failures(
    category: str, indices: Sequence[int] | None = None
) -> tuple[int, dict[str, Any]]:
    env = BFCLMultiTurnEnv(category=category, split="all")
    indices = range(len(env.tasks)) if indices is None else indices
    failures = {}
    for i in indices:
        await env.reset(seed=i)
        reward, info, records = await play(env, env.sample_actions())
        if reward != 1.0:
            failures[env.tasks[i].id] = (
                info.get("error_type"),
                [(r.name, r.status.value) for r in records if r.status is not ToolStatus.OK],
            )
    await env.close()
    return len(indices), failures


@pytest.mark.slow  # ~3 s on idle cores, 6 s under load; the sample below runs in the fast tier
async def test_ground_truth_passes_bfcls_checker_on_all_of_multi_turn_base() -> None:
    n, failures = await ground_truth_failures("base")
    assert n == 200
    assert set(failures) <= KNOWN_FAILURES, failures
    assert (n - len(failures)) / n >= 0.99
    assert failures["multi_turn_base_173"] == (
        "multi_turn:instance_state_mismatch",
        [("close_ticket", "bad_arguments")],
    )


@pytest.mark.parametrize("category", CATEGORIES)
async def test_ground_truth_passes_on_a_sample_of_every_category(category: str) -> None:
    n, failures = await ground_truth_failures(category, [*range(5, 200, 10), 173])
    assert n == 21 and set(failures) == {f"multi_turn_{category}_173"}, failures


@pytest.mark.slow
@pytest.mark.parametrize("category", CATEGORIES[1:])
async def test_ground_truth_passes_on_every_task_of_the_other_categories(category: str) -> None:
    n, failures = await ground_truth_failures(category)
    assert n == 200
    assert set(failures) <= KNOWN_FAILURES, failures
    assert (n - len(failures)) / n >= 0.99


@pytest.mark.parametrize("fmt", FORMATS)
async def test_ground_truth_passes_in_every_tool_call_format(fmt: str) -> None:
    env = BFCLMultiTurnEnv(category="base", split="all", tool_format=fmt)
    for seed in (0, 57, 120):  # file system + twitter, trading, travel/messaging tasks
        await env.reset(seed=seed)
        reward, info, records = await play(env, env.sample_actions())
        assert reward == 1.0, (fmt, seed, info)
        assert records and all(r.status is ToolStatus.OK for r in records)


async def test_wrong_call_sequences_score_zero() -> None:
    env = BFCLMultiTurnEnv(category="base", split="all")
    await env.reset(options={"task_id": "multi_turn_base_0"})
    right = list(env.sample_actions())
    # multi_turn_base_0's turn 0: cd(document), mkdir(temp), mv(final_report.pdf -> temp), then "Done."
    call = json.loads(right[0].split("<tool_call>\n")[1].split("\n</tool_call>")[0])
    assert call["name"] == "cd"

    async def outcome(actions: Sequence[str]) -> tuple[float, str]:
        await env.reset(options={"task_id": "multi_turn_base_0"})
        reward, info, _ = await play(env, actions)
        return reward, info.get("error_type", "")

    assert await outcome(right) == (1.0, "")
    # No call at all in a turn that needs some.
    assert await outcome(["I cannot do that."]) == (0.0, "multi_turn:empty_turn_model_response")
    # A wrong argument: the file system's state differs from the ground truth's.
    wrong_dir = render_calls("hermes", [("cd", {"folder": "document"}), ("mkdir", {"dir_name": "tmp"})])
    assert await outcome([wrong_dir, "Done."]) == (0.0, "multi_turn:instance_state_mismatch")
    # The right calls in a wrong order: mv before mkdir fails, so the state differs.
    cd, mkdir, mv = (
        ("cd", {"folder": "document"}),
        ("mkdir", {"dir_name": "temp"}),
        ("mv", {"source": "final_report.pdf", "destination": "temp"}),
    )
    assert (await outcome([render_calls("hermes", [cd, mv, mkdir]), "Done."]))[0] == 0.0
    # Every turn right except the last, which ends without its calls.
    ends = [k for k, text in enumerate(right) if text == "Done."]
    assert await outcome([*right[: ends[-2] + 1], "Done."]) == (0.0, "multi_turn:empty_turn_model_response")
    await env.close()


# -- the model's output is data ------------------------------------------------------------------------
PAYLOAD = "__import__('os').system('touch {sentinel}')"
BAD_NAMES = ("__class__", "eval", "exec", "__import__", "_load_scenario", "__init__", "__dict__", "system")


def injection_turns(fmt: str, sentinel: Path) -> list[str]:
    payload = PAYLOAD.format(sentinel=sentinel)
    calls: list[tuple[str, dict[str, Any]]] = [(name, {"file_name": payload}) for name in BAD_NAMES]
    calls += [
        ("touch", {"file_name": payload}),  # refused by the file system as a name: data
        ("touch", {"file_name": "x.txt"}),
        ("echo", {"content": payload, "file_name": "x.txt"}),
        ("cd", {"folder": f"'); {payload}; ('"}),
        ("mkdir", {"dir_name": payload, "__class__": payload}),  # an unknown keyword: refused
        ("ls", {"a": payload}),  # a string for a boolean: refused
    ]
    size = 4
    return [render_calls(fmt, calls[k : k + size]) for k in range(0, len(calls), size)] + ["Done."]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_injected_calls_execute_nothing_in_any_format(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sentinel = tmp_path / "pwned"
    evaluated: list[str] = []
    real_eval, real_exec = builtins.eval, builtins.exec

    def spy_eval(source: Any, *args: Any, **kwargs: Any) -> Any:
        evaluated.append(str(source))
        return real_eval(source, *args, **kwargs)

    def spy_exec(source: Any, *args: Any, **kwargs: Any) -> Any:
        evaluated.append(str(source))
        return real_exec(source, *args, **kwargs)

    env = BFCLMultiTurnEnv(category="base", split="all", tool_format=fmt)
    await env.reset(options={"task_id": "multi_turn_base_0"})
    monkeypatch.setattr(builtins, "eval", spy_eval)
    monkeypatch.setattr(builtins, "exec", spy_exec)
    records = []
    for text in injection_turns(fmt, sentinel):
        res = await env.step(Action(text=text))
        records += list(res.tool_calls)
    monkeypatch.undo()
    assert not sentinel.exists()
    # BFCL's executor evaluated its own ground-truth strings only, none of the model's text.
    assert not any("pwned" in source for source in evaluated), evaluated
    by_name: dict[str, list[Any]] = {}
    for r in records:
        by_name.setdefault(r.name, []).append(r)
    for name in BAD_NAMES:
        (rec,) = by_name[name]
        assert rec.status is ToolStatus.UNKNOWN_TOOL and "Unknown tool" in rec.output, (fmt, rec)
    assert by_name["touch"][0].status is ToolStatus.OK and "Invalid character" in by_name["touch"][0].output
    assert by_name["echo"][0].status is ToolStatus.OK
    assert (
        by_name["mkdir"][0].status is ToolStatus.BAD_ARGUMENTS and "__class__" in by_name["mkdir"][0].output
    )
    # A string for a boolean: refused by the schema check (or already by qwen3_coder's typed parser).
    ls = by_name["ls"][0]
    assert ls.status in (ToolStatus.BAD_ARGUMENTS, ToolStatus.PARSE_ERROR) and "boolean" in ls.output
    # The payload sits in the fake file system as a file's text, nothing more.
    assert env._episode is not None
    fs = env._episode.backends.instances["GorillaFileSystem"]
    assert fs._current_dir.contents["x.txt"].content == PAYLOAD.format(sentinel=sentinel)
    await env.close()


# -- BFCL's protocol -----------------------------------------------------------------------------------
async def test_miss_func_reveals_the_held_out_functions_at_bfcls_turn() -> None:
    env = BFCLMultiTurnEnv(category="miss_func", split="all")
    task = next(t for t in env.tasks if t.id == "multi_turn_miss_func_0")
    ((turn, names),) = task.missed_function.items()
    obs, _ = await env.reset(options={"task_id": task.id})
    system = obs[0].content
    shown = {
        json.loads(line)["function"]["name"]
        for line in system.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    }
    assert not shown & set(names) and len(shown) > 5
    unknown = await env.step(Action(text=render_calls("hermes", [("nonexistent", {})])))
    assert not any(
        f" {n}," in unknown.tool_calls[0].output or unknown.tool_calls[0].output.endswith(f" {n}.")
        for n in names
    )
    actions = list(env.sample_actions())
    for _ in range(turn):  # play the ground truth up to the turn that reveals them
        while True:
            res = await env.step(Action(text=actions.pop(0)))
            if not res.tool_calls:
                break
    texts = [m.content for m in res.observation]
    assert all(n in texts[-1] for n in names) and texts[-1].endswith("What about now?")
    reward, _, _ = await play(env, actions)
    assert reward == 1.0
    await env.close()


async def test_too_many_calling_steps_in_one_user_turn_fail_the_task() -> None:
    env = BFCLMultiTurnEnv(category="base", split="all", max_steps_per_turn=2)
    await env.reset(seed=0)
    ls = render_calls("hermes", [("ls", {})])
    assert not (await env.step(Action(text=ls))).terminated
    assert not (await env.step(Action(text=ls))).terminated
    res = await env.step(Action(text=ls))
    assert res.terminated and res.reward == 0.0 and res.info["error_type"] == "multi_turn:force_terminated"
    await env.close()


def test_the_test_split_is_a_fixed_disjoint_fifth() -> None:
    for category in CATEGORIES:
        train = {t.id for t in BFCLMultiTurnEnv(category=category).tasks}
        test = {t.id for t in BFCLMultiTurnEnv(category=category, split="test").tasks}
        every = {t.id for t in BFCLMultiTurnEnv(category=category, split="all").tasks}
        assert not train & test and train | test == every and len(every) == 200
        assert 25 <= len(test) <= 55
    assert [t.id for t in BFCLMultiTurnEnv(split="test").tasks][:3] == [
        t.id for t in BFCLMultiTurnEnv(split="test").tasks
    ][:3]


async def test_a_seed_is_the_tasks_index_in_the_split() -> None:
    env = BFCLMultiTurnEnv(category="long_context", split="test")
    n = len(env.tasks)
    _, first = await env.reset(seed=3)
    _, again = await env.reset(seed=3 + n)
    assert (
        first["task_id"] == again["task_id"] == env.tasks[3].id
        and first["category"] == "multi_turn_long_context"
    )
    await env.close()


def test_bad_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="miss_func"):
        BFCLMultiTurnEnv(category="parallel")
    with pytest.raises(ConfigError, match="split"):
        BFCLMultiTurnEnv(split="dev")
    with pytest.raises(ConfigError, match="tool_format"):
        BFCLMultiTurnEnv(tool_format="python")


def test_the_env_passes_agentrls_check() -> None:
    agentrl.check_env(agentrl.make("bfcl-multi-turn-v0"))
    agentrl.check_env(
        agentrl.make("bfcl-multi-turn-v0", category="miss_param", split="test", tool_format="mistral")
    )


def test_a_missing_wheel_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)
    with pytest.raises(ConfigError, match=r"pip install 'agentrl\[bfcl\]'") as err:
        agentrl.make("bfcl-multi-turn-v0")
    assert "--no-deps 'bfcl-eval==" in str(err.value)
    assert bfcl_data.INSTALL in str(err.value)


@pytest.mark.slow  # a fresh interpreter importing agentrl: ~5 s idle, 16 s under load
def test_agentrl_envs_lists_it_without_importing_bfcl() -> None:
    code = (
        "import sys, agentrl; from agentrl.trainers.cli import main; "
        "assert 'bfcl-multi-turn-v0' in agentrl.list_envs(); "
        "assert 'agentrl.envs.bfcl' not in sys.modules; "
        "main(['envs']); "  # reads each env's docstring: imports envs/bfcl.py, which imports no BFCL
        "assert 'bfcl_eval' not in sys.modules, 'listing imported bfcl_eval'"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True
    )
    assert re.search(r"^bfcl-multi-turn-v0 +BFCL v4 multi-turn", out.stdout, re.M), out.stdout


@pytest.mark.slow  # the 4,000-token prompt through the chat template at every turn: ~10 s idle, 33 s loaded
async def test_a_scripted_ground_truth_episode_runs_through_the_rollout_and_reexecutes() -> None:
    """The ground truth through the real chat template and tokenizer (the rollout's path), then replay's
    re-execution: a fresh env, every BFCL call run again, the same observations and reward."""
    from agentrl.chat import ChatRenderer
    from agentrl.episode import RolloutConfig, run_episode
    from agentrl.models import smollm2_tokenizer
    from agentrl.testing import ScriptedPolicy
    from agentrl.trainers.replay.reexec import areexec
    from agentrl.types import TrajectoryMeta

    tokenizer = smollm2_tokenizer()
    renderer = ChatRenderer(tokenizer)
    kwargs = {"category": "miss_func", "split": "test"}
    env = agentrl.make("bfcl-multi-turn-v0", **kwargs)
    await env.reset(seed=2)
    stop = renderer.stop_token_ids[0]
    turns = [[*tokenizer.encode(text), stop] for text in env.sample_actions()]
    policy = ScriptedPolicy(turns, stop_ids=renderer.stop_token_ids)
    config = RolloutConfig(max_turns=len(turns), max_new_tokens=512, max_total_tokens=16384)
    meta = TrajectoryMeta(env_id="bfcl-multi-turn-v0")
    traj = await run_episode(env, policy, renderer, config, seed=2, meta=meta)
    await env.close()
    assert traj.reward == 1.0 and traj.tool_calls and all(c.status == "ok" for c in traj.tool_calls)
    report = await areexec(traj, env_kwargs=kwargs)
    assert report.ok, report


@pytest.mark.slow  # a tiny-model train step, a replay and an evaluation on 4,000-token prompts: minutes
def test_train_replay_and_eval_from_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The training step runs ``python -m agentrl.trainers`` in a fresh interpreter (the env found by its id
    with nothing imported beforehand); the replay and the evaluations call the same CLI's ``main`` in this
    process, on that run's folder, which spares each a fresh interpreter's imports of torch and
    transformers (most of such a command's CPU time when the env is not the one being found)."""
    from agentrl.trainers.cli import main as cli_main

    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> str:
        if args[0] == "train":
            out = subprocess.run(
                [sys.executable, "-m", "agentrl.trainers", *args], capture_output=True, text=True, timeout=900
            )
            assert out.returncode == 0, out.stderr[-3000:]
            return out.stdout
        capsys.readouterr()
        code = cli_main(list(args))
        captured = capsys.readouterr()
        assert code == 0, captured.out[-3000:] + captured.err[-3000:]
        return captured.out

    kwargs = '{"category": "long_context"}'
    run(
        *("train", "--env", "bfcl-multi-turn-v0", "--env-kwargs", kwargs, "--model", "tiny", "--steps", "1"),
        *(
            "--group-size",
            "2",
            "--groups-per-step",
            "1",
            "--rollout.max-new-tokens",
            "8",
            "--rollout.max-turns",
            "2",
        ),
        *("--rollout.max-total-tokens", "8192", "--eval.tasks", "0", "--no-progress", "--out", "run"),
    )
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["env_kwargs"] == {"category": "long_context"}
    assert "2 of 2 trajectories replayed identically" in run("replay", "run", "--reexec", "--rescore")
    report = json.loads(
        run("eval", "--model", "run", "--tasks", "1", "--k", "1", "--json").strip().splitlines()[-1]
    )
    assert report["split"] == "test" and report["tasks"] == 1
    other = '{"category": "miss_param"}'
    args = (
        "eval",
        "--env",
        "bfcl-multi-turn-v0",
        "--model",
        "tiny",
        "--env-kwargs",
        other,
        "--tasks",
        "1",
        "--k",
        "1",
    )
    report = json.loads(
        run(*args, "--max-total-tokens", "8192", "--max-new-tokens", "8", "--json").splitlines()[-1]
    )
    assert report["env"] == "bfcl-multi-turn-v0" and report["tasks"] == 1
