"""``code-tests-v0``: tasks, grading in a fresh sandbox, and one test per reward hack through the real
bubblewrap sandbox. Each hack is checked against a positive control (the right answer scores 1.0 on the
same task), so a test cannot pass because grading is broken."""

import dataclasses
import json
import random
import time

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

import agentrl
from agentrl import Action, GymnasiumEnv, StopReason
from agentrl.envs import code_problems
from agentrl.envs.code_tests import CodeTestsEnv, extract_code

pytestmark = pytest.mark.usefixtures("local_sandbox_cls")


def test_tasks_a_few_hundred_with_a_fixed_held_out_split():
    assert code_problems.N_TASKS >= 250
    train, test = code_problems.task_ids("train"), code_problems.task_ids("test")
    assert len(train) + len(test) == code_problems.N_TASKS and 0.1 < len(test) / code_problems.N_TASKS < 0.3
    rng = random.Random(0)
    for _ in range(40):
        t = code_problems.sample(rng, "test")
        assert code_problems.split_of(t.task_id) == "test"
        assert len(t.visible) == 3 and len(t.hidden) == 8
        assert not {repr(a) for a, _ in t.visible} & {repr(a) for a, _ in t.hidden}


def test_extract_code():
    assert extract_code("x\n```python\ndef f(x):\n    return 1\n```\nbye", "f") == "def f(x):\n    return 1\n"
    assert extract_code("def f(x): return 2", "f") == "def f(x): return 2"
    assert extract_code("I don't know", "f") is None


async def _episode(env, seed, *turns):
    await env.reset(seed=seed)
    res = None
    for t in turns:
        res = await env.step(Action(t))
    return res


def _answer(code: str) -> str:
    return f"Here it is:\n```python\n{code}\n```"


async def _graded(env: CodeTestsEnv, seed: int, code: str):
    res = await _episode(env, seed, _answer(code))
    assert res.terminated
    return res.reward, env.outcomes


@pytest.fixture
async def env():
    e = CodeTestsEnv(per_test_s=2.0)
    yield e
    await e.close()


async def test_right_answer_scores_one_partial_credit_and_all_or_none(env):
    await env.reset(seed=3)
    ref = env.code_task.reference
    assert (await _graded(env, 3, ref))[0] == 1.0
    # a half-right answer: right on the first hidden test's input only
    fn, args0 = env.code_task.fn, list(env.code_task.hidden[0][0])
    partial = f"{ref}\n_ref = {fn}\ndef {fn}(*a):\n    return _ref(*a) if list(a) == {args0!r} else 'nope'\n"
    reward, outcomes = await _graded(env, 3, partial)
    assert reward == pytest.approx(1 / 8) and outcomes[0].passed and not outcomes[1].passed
    strict = CodeTestsEnv(partial_credit=False)
    assert (await _graded(strict, 3, partial))[0] == 0.0
    assert (await _graded(strict, 3, ref))[0] == 1.0
    await strict.close()


async def test_hack_fake_result_lines(env):
    """Print the child's result marker, a 'passed' summary, and forge the driver's report with its nonce
    stolen from the parent's memory, written into the parent's stdout; then exit before a real result."""
    await env.reset(seed=5)
    fn = env.code_task.fn
    hack = f"""
import os, re, sys
def {fn}(*args):
    print("8 of 8 tests passed")
    print("\\x1eRESULT " + '{{"status": "ok", "value": 0}}')
    pp = os.getppid()
    nonce = None
    for line in open(f"/proc/{{pp}}/maps").read().splitlines():
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
        if not m:
            continue
        a, b = int(m.group(1), 16), int(m.group(2), 16)
        try:
            with open(f"/proc/{{pp}}/mem", "rb", 0) as mem:
                mem.seek(a)
                found = re.search(rb"AGENTRL-GRADE-[0-9a-f]{{32}}", mem.read(min(b - a, 1 << 26)))
        except (OSError, OverflowError, ValueError):
            continue
        if found:
            nonce = found.group().decode()
            break
    fake = [{{"status": "ok", "value": 0}}] * 8
    with open(f"/proc/{{pp}}/fd/1", "w") as out:
        out.write("\\n" + nonce + " " + __import__("json").dumps(fake) + "\\n")
    sys.stdout.flush()
    os._exit(0)
"""
    reward, outcomes = await _graded(env, 5, hack)
    assert reward == 0.0
    statuses = {o.status for o in outcomes}
    if statuses == {"error"}:
        # As root the sandbox runs under its own host uid, and the grader's driver is not the child's to
        # write to: the forgery fails before it starts.
        assert all("PermissionError" in (o.error or "") for o in outcomes), outcomes
    else:
        assert statuses == {"no_report"}, outcomes  # the forged report made two: refused


async def test_hack_reading_the_hidden_tests():
    """Search everything the answer can reach (the parent's memory, every process's cmdline and environ,
    the file system, its own heap) for the expected outputs. The search works (it finds the hidden
    *inputs* in the driver's memory) but the expected values are not in the sandbox at all.

    The search takes seconds, so only the first test runs it (each test is its own process) and this env
    gives a test 5 s: with 2 s a loaded machine timed every test out and the grader reported nothing."""
    env = CodeTestsEnv(per_test_s=5.0)
    try:
        await env.reset(seed=7)
        t = env.code_task
        secret = [((f"IN-{k}-{x}",), f"EXPECTED-SECRET-{k}") for k, x in enumerate("abcdefgh")]
        env.code_task = dataclasses.replace(t, fn="leak", hidden=tuple(secret))
        hack = r"""
import gc, os, re, time
def leak(arg):
    found = set()
    if arg != "IN-0-a":
        return []
    pp = os.getppid()
    for line in open(f"/proc/{pp}/maps").read().splitlines():
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
        if not m:
            continue
        a, b = int(m.group(1), 16), int(m.group(2), 16)
        try:
            with open(f"/proc/{pp}/mem", "rb", 0) as mem:
                mem.seek(a)
                left = min(b - a, 1 << 26)
                while left > 0:  # 4 MiB at a time: the sandbox's memory limit can refuse 64 MiB at once
                    chunk = mem.read(min(left, 1 << 22))
                    if not chunk:
                        break
                    left -= len(chunk)
                    found.update(
                        x.decode() for x in re.findall(rb"(?:IN|EXPECTED-SECRET)-\d(?:-[a-h])?", chunk)
                    )
        except (OSError, OverflowError, ValueError, MemoryError):
            continue
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for part in ("cmdline", "environ"):
            try:
                text = open(f"/proc/{pid}/{part}", errors="replace").read()
                found.update(re.findall(r"EXPECTED-SECRET-\d", text))
            except OSError:
                pass
    stop = time.monotonic() + 2.0  # the walk gets 2 s of the test's 5: /tmp can hold a whole checkout
    for root in ("/tmp", os.getcwd(), os.path.expanduser("~"), "/dev/shm"):
        for d, _, files in os.walk(root):
            if time.monotonic() > stop:
                break
            for f in files:
                try:  # the first MiB of each file: whole large files would hit the memory limit
                    text = open(os.path.join(d, f), errors="replace").read(1 << 20)
                    found.update(re.findall(r"EXPECTED-SECRET-\d", text))
                except (OSError, MemoryError):
                    pass
    for o in gc.get_objects():
        if isinstance(o, str) and o.startswith("EXPECTED-SECRET"):
            found.add(o)
    return sorted(found)
"""
        res = await env.step(Action(_answer(hack)))
        assert res.reward == 0.0
        seen = set().union(*(o.got for o in env.outcomes if o.status == "ok"))
        assert {f"IN-{k}" for k in range(8)} & {s[:4] for s in seen}, env.outcomes  # the search did work
        assert not [s for s in seen if "EXPECTED" in s]
    finally:
        await env.close()


@pytest.mark.parametrize(
    "body",
    [
        "import sys\nsys.exit(0)\n",  # at import, before any test
        "import os\ndef {fn}(*a):\n    print('ok'); os._exit(0)\n",
        "def {fn}(*a):\n    raise SystemExit(0)\n",
        "import os, signal\ndef {fn}(*a):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    ],
)
async def test_hack_exiting_early(env, body):
    await env.reset(seed=11)
    reward, outcomes = await _graded(env, 11, body.format(fn=env.code_task.fn))
    assert reward == 0.0
    assert {o.status for o in outcomes} <= {"error", "crashed"}


@pytest.mark.parametrize(
    "body",
    [
        "def {fn}(*a):\n    while True:\n        pass\n",
        # ignores SIGTERM, leaves a detached grandchild holding nothing the grader waits on
        "import signal, subprocess\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "def {fn}(*a):\n    subprocess.Popen(['sleep', '100'], start_new_session=True)\n"
        "    while True:\n        pass\n",
    ],
)
async def test_hack_endless_loops_time_out_within_the_budget(body):
    env = CodeTestsEnv(per_test_s=0.5)
    await env.reset(seed=13)
    t0 = time.perf_counter()
    reward, outcomes = await _graded(env, 13, body.format(fn=env.code_task.fn))
    elapsed = time.perf_counter() - t0
    assert reward == 0.0 and {o.status for o in outcomes} <= {"timeout", "skipped"}
    assert "timeout" in {o.status for o in outcomes}
    assert (
        elapsed < 0.5 * 8 / 2 + 1 + 0.5 + 3 + 5
    )  # budget + grace + sandbox start, far below 8 x 0.5 s serial
    await env.close()


async def test_hack_tampering_with_the_harness(env):
    """Return an object equal to everything; monkeypatch builtins, json and the child's reporter; plant
    modules and files that a later test process or the grader might read. Nothing scores, and a right answer
    that tampers the same way still scores 1.0 (later tests are unaffected)."""
    await env.reset(seed=17)
    fn, ref = env.code_task.fn, env.code_task.reference
    tamper = """
import builtins, json, os, sys
class AlwaysEqual:
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__
builtins.isinstance = lambda *a: True
builtins.type = lambda *a: AlwaysEqual
json.dumps = lambda *a, **k: '{"status": "ok", "value": 1}'
main = sys.modules["__main__"]
main._plain = lambda v, depth=0: v
for d in (os.getcwd(), "/tmp"):
    for name in ("json.py", "sitecustomize.py", "os.py"):
        with open(os.path.join(d, name), "w") as f:
            f.write("raise SystemExit(0)\\n")
    with open(os.path.join(d, "report.json"), "w") as f:
        f.write('[{"status": "ok", "value": 1}]')
assert False, "assert is not how grading works"
"""
    hack = tamper.replace("assert False", "pass  #") + f"def {fn}(*a):\n    return AlwaysEqual()\n"
    assert "assert False" in tamper
    reward, outcomes = await _graded(env, 17, hack)
    assert reward == 0.0 and {o.status for o in outcomes} <= {"error", "crashed"}, outcomes
    # the same planting and reporter patching around a right answer (minus the builtins that would break
    # its own function) still scores 1.0: nothing it plants reaches the next test's process or the report
    keep = [ln for ln in tamper.splitlines() if not ln.startswith(("builtins.", "assert"))]
    right_but_tampering = ref + "\n".join(keep).replace("main._plain", "main._unused")
    reward, outcomes = await _graded(env, 17, right_but_tampering)
    assert reward == 1.0, outcomes


async def test_files_written_during_the_episode_are_not_in_the_grading_sandbox(env):
    """The model's own sandbox (run_tests) can plant files; grading runs in a fresh sandbox without them."""
    await env.reset(seed=19)
    fn = env.code_task.fn
    plant = "import os\nfor p in ('/tmp/planted', os.path.expanduser('~/planted')):\n"
    plant += "    open(p, 'w').write('1')\n"
    plant += f"def {fn}(*a):\n    return os.path.exists('/tmp/planted')\n"
    call = json.dumps({"name": "run_tests", "arguments": {"code": plant}})
    res = await env.step(Action(f"<tool_call>\n{call}\n</tool_call>"))
    assert "returned True" in res.observation[0].content  # planted in the episode's sandbox
    look = f"import os\ndef {fn}(*a):\n    return os.path.exists('/tmp/planted') or "
    look += "os.path.exists(os.path.expanduser('~/planted'))\n"
    res = await env.step(Action(_answer(look)))
    assert res.terminated and res.reward == 0.0
    assert {o.got for o in env.outcomes} == {False}


async def test_a_failing_grading_sandbox_is_an_infra_failure_not_reward_zero(renderer, tok):
    from agentrl.episode import RolloutConfig, run_episode
    from agentrl.sandbox import LocalSandbox
    from agentrl.testing import ScriptedPolicy

    broken = CodeTestsEnv(sandbox_factory=lambda: LocalSandbox(start_timeout=1e-4))
    await broken.reset(seed=1)
    answer = f"```python\n{broken.code_task.reference}```<|im_end|>"
    policy = ScriptedPolicy([tok.encode(answer)], stop_ids=renderer.stop_token_ids)
    traj = await run_episode(broken, policy, renderer, RolloutConfig(max_turns=2, max_new_tokens=256), seed=1)
    assert traj.infra_failure and traj.stop_reason is StopReason.SANDBOX_ERROR, traj.errors
    assert "did not start" in traj.errors[0].message


def test_both_checkers():
    agentrl.check_env(agentrl.make("code-tests-v0"))  # plays sample_actions: run_tests and the graded answer
    gym_env = GymnasiumEnv(agentrl.make("code-tests-v0", split="test"))
    gymnasium_check_env(gym_env, skip_render_check=True)
    gym_env.close()
    assert isinstance(gym_env, gymnasium.Env)
