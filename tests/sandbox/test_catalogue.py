"""The adversarial catalogue of docs/shared sandbox-safety.md §3, one test per applicable case.

Every test runs under the ``no_leaks`` fixture (conftest): no process, cgroup, mount or temp dir may be left
behind. Cases are parametrised over the backends that run here (``local`` always; ``docker`` when an engine
can be started, see conftest). Case numbers are in the test names.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from agentrl.execution import ExecResult, Limits
from agentrl.types import ToolStatus

from .conftest import SMALL, MiB

pytestmark = pytest.mark.usefixtures("no_leaks")


def _json_safe(r: ExecResult) -> None:
    json.dumps({"stdout": r.stdout, "stderr": r.stderr, "message": r.message})
    for text in (r.stdout, r.stderr):
        text.encode("utf-8")  # no lone surrogates


def _not_infra(r: ExecResult) -> None:
    assert r.status is not ToolStatus.SANDBOX_ERROR, r


# ---- time ----------------------------------------------------------------------------------------
async def test_01_busy_loop_times_out_with_partial_output(sb):
    t = time.monotonic()
    r = await sb.run("print('started', flush=True)\nwhile True: pass", timeout=1)
    assert r.status is ToolStatus.TIMEOUT
    assert r.state_lost and "state" in r.message
    assert "started" in r.stdout
    assert time.monotonic() - t < 1 + 1.5


async def test_02_sleep_forever_is_wall_clock_killed(sb):
    t = time.monotonic()
    r = await sb.run("import time; time.sleep(10**9)", timeout=1)
    assert r.status is ToolStatus.TIMEOUT
    assert time.monotonic() - t < 1 + 1.5


async def test_03_stdin_is_empty(sb):
    t = time.monotonic()
    r = await sb.run("print(input())", timeout=2)
    assert r.status is ToolStatus.ERROR
    assert "EOFError" in r.stderr
    assert time.monotonic() - t < 1.5


async def test_04_ignoring_sigterm_and_sigint_does_not_help(sb):
    t = time.monotonic()
    code = "import signal,time\n[signal.signal(s, signal.SIG_IGN) for s in (2, 15)]\ntime.sleep(999)"
    r = await sb.run(code, timeout=1)
    assert r.status is ToolStatus.TIMEOUT
    assert time.monotonic() - t < 1 + 1.0


async def test_05_swallowed_interrupt_restarts_the_session(sb):
    await sb.run("kept = 1")
    code = "import time\nwhile True:\n  try: time.sleep(1)\n  except KeyboardInterrupt: pass"
    r = await sb.run(code, timeout=1)
    assert r.status is ToolStatus.TIMEOUT and r.state_lost
    r = await sb.run("'kept' in globals()")
    assert r.status is ToolStatus.OK and r.stdout == "False\n"


async def test_06_next_call_after_timeout_answers_promptly(sb):
    r = await sb.run("import time; time.sleep(300)", timeout=1)
    assert r.status is ToolStatus.TIMEOUT
    t = time.monotonic()
    r = await sb.run("1+1")
    assert r.status is ToolStatus.OK and r.stdout == "2\n"
    assert time.monotonic() - t < 2.0


# ---- processes -----------------------------------------------------------------------------------
async def test_07_fork_bomb_hits_the_process_limit(sb, make):
    r = await sb.run("import os\nwhile True: os.fork()", timeout=5)
    # Usually EAGAIN from the pids limit; dozens of forked interpreters can also hit the memory limit.
    assert r.status in (ToolStatus.ERROR, ToolStatus.KILLED, ToolStatus.TIMEOUT, ToolStatus.OOM), r
    if r.status is ToolStatus.ERROR:
        assert "BlockingIOError" in r.stderr or "Resource temporarily unavailable" in r.stderr
    # The session and a neighbour can still fork afterwards.
    code = "import subprocess; print(subprocess.run(['true']).returncode)"
    assert (await sb.run(code)).stdout == "0\n"
    async with make() as other:
        assert (await other.run(code)).stdout == "0\n"


async def test_08_thread_bomb_hits_the_same_limit(sb):
    code = (
        "import threading,time\nwhile 1: threading.Thread(target=time.sleep, args=(99,), daemon=True).start()"
    )
    r = await sb.run(code, timeout=5)
    assert r.status in (ToolStatus.ERROR, ToolStatus.OOM), r
    assert "can't start new thread" in r.stderr or "MemoryError" in r.stderr or r.status is ToolStatus.OOM


# ---- memory --------------------------------------------------------------------------------------
async def test_09_instant_memory_bomb_is_oom(sb):
    r = await sb.run("x = bytearray(1 << 36)")
    assert r.status is ToolStatus.OOM
    assert "MemoryError" in r.stderr or "memory" in r.message.lower()


async def test_10_gradual_memory_bomb_is_oom_and_contained(sb):
    r = await sb.run("a = []\nwhile 1: a.append(b'x' * 10**7)", timeout=10)
    assert r.status is ToolStatus.OOM, r
    r = await sb.run("a = None\n1 + 1")
    assert r.status is ToolStatus.OK and r.stdout.endswith("2\n")


async def test_11_tmpfs_is_bounded(sb):
    code = "f = open('/dev/shm/f', 'wb')\nfor _ in range(4096): f.write(b'x' * (1 << 20))"
    r = await sb.run(code, timeout=10)
    assert r.status in (ToolStatus.ERROR, ToolStatus.OOM), r
    assert "No space left" in r.stderr or "File too large" in r.stderr or r.status is ToolStatus.OOM


# ---- output --------------------------------------------------------------------------------------
def _maxrss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def test_12_endless_stdout_is_capped_and_stopped(sb):
    before = _maxrss_mb()
    r = await sb.run("while True: print('A' * 1000)", timeout=10)
    assert r.status is ToolStatus.OUTPUT_LIMIT, r
    assert r.truncated and r.state_lost
    assert len(r.stdout) <= SMALL.output_bytes + 200
    assert "omitted" in r.stdout
    assert _maxrss_mb() - before < 64


async def test_13_endless_stderr_line_is_capped(sb):
    r = await sb.run("import sys\nwhile 1: sys.stderr.write('x' * 65536)", timeout=10)
    assert r.status is ToolStatus.OUTPUT_LIMIT, r
    assert len(r.stderr) <= SMALL.output_bytes + 200


async def test_14_output_above_the_pipe_buffer_returns_promptly(sb):
    t = time.monotonic()
    r = await sb.run("print('x' * 200_000)")
    assert r.status is ToolStatus.OK
    assert r.truncated and r.stdout.startswith("x") and r.stdout.endswith("x\n")
    assert time.monotonic() - t < 2


async def test_15_binary_output_is_decoded_with_replacement(sb):
    r = await sb.run("import sys; sys.stdout.buffer.write(bytes(range(256)))")
    assert r.status is ToolStatus.OK
    assert "\ufffd" in r.stdout and "ABC" in r.stdout
    _json_safe(r)


async def test_16_truncation_respects_character_boundaries(sb):
    r = await sb.run("print('é' * 100_000)")
    assert r.status is ToolStatus.OK and r.truncated
    assert "\ufffd" not in r.stdout
    assert r.stdout.startswith("éé") and r.stdout.endswith("é\n")


async def test_17_surrogates_nul_and_ansi_are_json_safe(sb):
    r = await sb.run(r"import sys; sys.stdout.buffer.write(b'\xed\xa0\x80\x00\x1b[2J')")
    assert r.status is ToolStatus.OK
    _json_safe(r)
    assert "\x00" in r.stdout and "\ufffd" in r.stdout


# ---- host files and secrets ----------------------------------------------------------------------
async def test_18_host_secrets_are_absent(sb):
    r = await sb.run("print(open('/etc/shadow').read())")
    assert r.status is ToolStatus.ERROR
    assert "FileNotFoundError" in r.stderr or "PermissionError" in r.stderr


async def test_19_environment_is_an_allow_list(sb_factory, monkeypatch):
    monkeypatch.setenv("E2B_API_KEY", "sk-secret-123")
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret")
    async with sb_factory() as sb:
        r = await sb.run("import os; print(dict(os.environ))")
    assert r.status is ToolStatus.OK
    assert "secret" not in r.stdout
    env = eval(r.stdout)  # a dict literal printed by the sandbox
    assert set(env) <= {
        "PATH",
        "HOME",
        "PWD",
        "TMPDIR",
        "LANG",
        "PYTHONIOENCODING",
        "MPLBACKEND",
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "RAYON_NUM_THREADS",
        "HOSTNAME",
    }
    assert env["OMP_NUM_THREADS"] == "1"


async def test_20_home_and_ssh_keys_are_not_mounted(sb):
    code = (
        "import os, glob, json\n"
        "try: root = sorted(os.listdir('/root'))\n"
        "except OSError as e: root = repr(e)\n"
        "print(json.dumps([glob.glob(os.path.expanduser('~/.ssh/*')), glob.glob('/root/.ssh/*'), root]))"
    )
    r = await sb.run(code)
    assert r.status is ToolStatus.OK, r
    home_keys, root_keys, root = json.loads(r.stdout)
    assert home_keys == [] and root_keys == []
    # At most the interpreter's own install path (bound read-only) is visible under /root.
    assert isinstance(root, str) or set(root) <= {".pyenv"}


async def test_21_writing_outside_the_workdir_fails(sb):
    target = "/usr/lib/python3/agentrl_probe.py"
    r = await sb.run(f"open({target!r}, 'w').write('1')")
    assert r.status is ToolStatus.ERROR
    assert (
        "Read-only file system" in r.stderr or "Permission denied" in r.stderr or "No such file" in r.stderr
    )
    assert not os.path.exists(target)


async def test_22_cannot_poison_tools_for_later_calls(sb):
    before = os.stat("/bin/sh")
    r = await sb.run("open('/bin/sh', 'wb').write(b'')")
    assert r.status is ToolStatus.ERROR
    after = os.stat("/bin/sh")
    assert (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns)
    r = await sb.run(
        "import subprocess; print(subprocess.run(['sh', '-c', 'echo fine'], capture_output=True).stdout)"
    )
    assert r.status is ToolStatus.OK and "fine" in r.stdout


async def test_23_filling_the_disk_stops_at_the_quota(sb):
    r = await sb.run("f = open('big', 'wb')\nwhile 1: f.write(b'0' * (1 << 20))", timeout=10)
    assert r.status is ToolStatus.ERROR, r
    assert "File too large" in r.stderr or "No space left" in r.stderr
    # The scratch space is still usable and is the session's own.
    r = await sb.run(f"import os; os.path.getsize('big') <= {SMALL.file_size_bytes}")
    assert r.stdout == "True\n"


async def test_24_inode_exhaustion_is_bounded(sb):
    r = await sb.run("[open(f'f{i}', 'w').close() for i in range(10**7)]", timeout=2)
    assert r.status in (ToolStatus.TIMEOUT, ToolStatus.ERROR, ToolStatus.OOM), r


async def test_25_files_do_not_survive_into_the_next_episode(sb):
    r = await sb.run(
        "open('/tmp/m','w').write('1'); open('/dev/shm/m','w').write('1'); open('here','w').write('1')"
    )
    assert r.status is ToolStatus.OK, r
    await sb.reset()
    r = await sb.run("import os; [os.path.exists(p) for p in ('/tmp/m', '/dev/shm/m', 'here')]")
    assert r.stdout == "[False, False, False]\n"


async def test_26_symlink_bait_points_nowhere(sb):
    r = await sb.run("import os; os.symlink('/etc/shadow', 'result.txt'); open('result.txt').read()")
    assert r.status is ToolStatus.ERROR
    assert "No such file" in r.stderr  # the link target does not exist inside; the host never reads it


async def test_27_path_traversal_cannot_write_outside(sb):
    r = await sb.run("open('../../etc/cron.d/agentrl_x', 'w').write('* * * * * root true')")
    assert r.status is ToolStatus.ERROR
    assert not os.path.exists("/etc/cron.d/agentrl_x")


# ---- network -------------------------------------------------------------------------------------
async def test_28_host_loopback_services_are_unreachable(sb):
    hits = []
    server = await asyncio.start_server(lambda r, w: (hits.append(1), w.close()), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        r = await sb.run(f"import socket; socket.create_connection(('127.0.0.1', {port}), 2)")
    finally:
        server.close()
        await server.wait_closed()
    assert r.status is ToolStatus.ERROR
    assert "ConnectionRefusedError" in r.stderr or "OSError" in r.stderr
    assert hits == []


async def test_29_external_network_fails_fast(sb):
    t = time.monotonic()
    r = await sb.run("import urllib.request as u; u.urlopen('http://example.com', timeout=3)")
    assert r.status is ToolStatus.ERROR
    assert time.monotonic() - t < 2.5


async def test_30_metadata_and_raw_ip_are_blocked(sb):
    t = time.monotonic()
    r = await sb.run("import urllib.request as u; u.urlopen('http://169.254.169.254/', timeout=2)")
    assert r.status is ToolStatus.ERROR
    assert time.monotonic() - t < 2.5


async def test_31_raw_sockets_are_denied(sb):
    r = await sb.run("import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)")
    assert r.status is ToolStatus.ERROR
    assert "PermissionError" in r.stderr or "Operation not permitted" in r.stderr


# ---- killing things ------------------------------------------------------------------------------
async def test_32_killing_the_parent_leaves_the_host_alone(sb):
    r = await sb.run("import os; os.kill(os.getppid(), 9)")
    _not_infra(r)
    assert (await sb.run("1 + 1")).stdout == "2\n"


async def test_33_kill_everything_only_reaches_the_sandbox(sb, make):
    async with make() as neighbour:
        await neighbour.run("n = 41")
        r = await sb.run("import os; os.kill(-1, 9)")
        _not_infra(r)
        assert (await neighbour.run("n + 1")).stdout == "42\n"
    assert (await sb.run("1 + 1")).stdout == "2\n"


@pytest.mark.parametrize(
    "code,exit_code",
    [
        ("print('ok'); import os; os._exit(0)", 0),
        ("print('ok'); import sys; sys.exit(0)", 0),
        ("print('ok'); exit(3)", 3),
    ],
)
async def test_34_exiting_is_reported_and_restarts(sb, code, exit_code):
    await sb.run("before = 1")
    r = await sb.run(code)
    assert r.status is ToolStatus.ERROR  # never a pass by itself
    assert r.exit_code == exit_code and r.state_lost and "exit" in r.message
    assert r.stdout.startswith("ok")
    assert (await sb.run("'before' in globals()")).stdout == "False\n"


async def test_35_segfault_is_reported_as_killed(sb):
    r = await sb.run("import ctypes; ctypes.string_at(0)")
    assert r.status is ToolStatus.KILLED
    assert "SIGSEGV" in r.message and r.state_lost
    assert (await sb.run("1 + 1")).stdout == "2\n"


async def test_36_deep_recursion_ends_promptly(sb):
    t = time.monotonic()
    code = "import sys; sys.setrecursionlimit(10**7)\ndef f(n): return f(n+1)\nf(0)"
    r = await sb.run(code, timeout=2)
    # CPython 3.11+ keeps Python frames off the C stack, so this may grow the heap until the memory or
    # wall limit instead of segfaulting; any of those, by the deadline, is correct.
    assert r.status in (ToolStatus.KILLED, ToolStatus.ERROR, ToolStatus.OOM, ToolStatus.TIMEOUT), r
    assert time.monotonic() - t < 2 + 1
    assert (await sb.run("1 + 1")).stdout == "2\n"


async def test_37_background_thread_output_stays_out_of_later_calls(sb):
    code = (
        "import threading, time\n"
        "threading.Thread(target=lambda: [time.sleep(.05) or print('late') for _ in range(10**6)],"
        " daemon=True).start()"
    )
    assert (await sb.run(code)).status is ToolStatus.OK
    r = await sb.run("import time; time.sleep(0.5); print('mine')")
    assert r.stdout == "mine\n"
    await sb.reset()
    r = await sb.run("import threading; threading.active_count()")
    assert r.stdout == "1\n"


async def test_38_subprocess_outliving_the_call_is_killed(sb):
    r = await sb.run(
        "import subprocess; p = subprocess.Popen(['sleep', '1000'], start_new_session=True); p.pid"
    )
    assert r.status is ToolStatus.OK
    r = await sb.run("import os; sorted(int(p) for p in os.listdir('/proc') if p.isdigit())")
    assert set(eval(r.stdout)) <= {1, 2}, r.stdout  # only the namespace's init and/or the worker


async def test_39_grandchild_holding_the_pipe_does_not_block(sb):
    t = time.monotonic()
    r = await sb.run(
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(999)'])"
        "; print('done')",
        timeout=5,
    )
    assert r.status is ToolStatus.OK and "done" in r.stdout
    assert time.monotonic() - t < 2


async def test_40_ptrace_is_denied(sb):
    r = await sb.run("import ctypes; print(ctypes.CDLL(None).ptrace(16, 1, 0, 0))")
    assert r.status is ToolStatus.OK
    assert r.stdout == "-1\n"


async def test_41_proc_shows_only_the_sandbox(sb):
    code = (
        "import os; print([open(f'/proc/{p}/cmdline','rb').read() for p in os.listdir('/proc')"
        " if p.isdigit()])"
    )
    r = await sb.run(code)
    assert r.status is ToolStatus.OK
    assert "pytest" not in r.stdout and "agentrl" not in r.stdout
    assert len(eval(r.stdout)) <= 3  # init, the worker and nothing else


async def test_42_tiocsti_fails_without_a_tty(sb):
    r = await sb.run("import fcntl, termios; fcntl.ioctl(0, termios.TIOCSTI, b'x')")
    assert r.status is ToolStatus.ERROR
    assert "OSError" in r.stderr


async def test_43_python_level_escapes_are_irrelevant(sb):
    r = await sb.run("len(().__class__.__base__.__subclasses__()) > 10")
    assert r.status is ToolStatus.OK and r.stdout == "True\n"  # nothing relies on filtering builtins


# ---- hostile input -------------------------------------------------------------------------------
async def test_44_very_long_code_is_rejected_before_spawning(sb):
    t = time.monotonic()
    r = await sb.run("x=1\n" * 5_000_000)
    assert r.status is ToolStatus.ERROR and "code too large" in r.message
    assert time.monotonic() - t < 1
    assert (await sb.run("1")).stdout == "1\n"


async def test_45_nul_byte_in_code_is_the_codes_error(sb):
    r = await sb.run("print(1)\x00")
    assert r.status is ToolStatus.ERROR
    assert "null" in r.stderr.lower()


async def test_46_unicode_tricks_behave_like_cpython(sb):
    code = "\ufeffs = 'a\u202eb\u2028c'\nраз = 1\nprint(len(s), раз)"
    r = await sb.run(code)
    _not_infra(r)
    _json_safe(r)
    r = await sb.run("s = '\ud800'")  # a lone surrogate in the code itself
    _not_infra(r)
    _json_safe(r)


# ---- state ---------------------------------------------------------------------------------------
async def test_47_no_state_leaks_across_episodes(sb, make):
    await sb.run("SECRET = 42\nimport builtins; builtins.print = None")
    await sb.reset()
    r = await sb.run("print(globals().get('SECRET'))")
    assert r.stdout == "None\n"
    async with make() as fresh:
        assert (await fresh.run("print(globals().get('SECRET'))")).stdout == "None\n"


async def test_48_state_is_kept_within_an_episode(sb):
    assert (await sb.run("x = 1")).status is ToolStatus.OK
    r = await sb.run("x += 1; x")
    assert r.stdout == "2\n" and not r.state_lost


async def test_49_sandbox_killed_from_outside_is_an_infra_error(sb, kill_backend):
    task = asyncio.ensure_future(sb.run("import time; time.sleep(300)", timeout=30))
    await asyncio.sleep(0.5)
    t = time.monotonic()
    await kill_backend(sb)
    r = await task
    assert r.status is ToolStatus.SANDBOX_ERROR, r
    assert r.status.is_infra
    assert time.monotonic() - t < 5
    assert (await sb.run("1 + 1")).stdout == "2\n"


async def test_50_model_chosen_limits_are_clamped(make):
    async with make(Limits(wall_s=1.0, memory_bytes=256 * MiB)) as sb:
        t = time.monotonic()
        r = await sb.run("import time; time.sleep(60)", timeout=1e9)
        assert r.status is ToolStatus.TIMEOUT
        assert time.monotonic() - t < 2.5
        r = await sb.run("1", timeout=float("nan"))
        assert r.status is ToolStatus.ERROR
        r = await sb.run("1", timeout=-5)
        assert r.status is ToolStatus.ERROR
    assert Limits(wall_s=5).clamp(Limits(wall_s=50, memory_bytes=1 << 40)) == Limits(wall_s=5)


@pytest.mark.slow
async def test_51_thread_hungry_library_under_the_pids_cap(make):
    code = "import numpy as np; round(float(np.linalg.svd(np.ones((500, 500)))[1][0]), 6)"

    # The claim is "works under the pids cap, 32 at once" (sandbox-safety.md #51), not a speed: in the idle
    # .ci/run of 2026-11-28 one of the 32 hit a 30 s wall limit beside three Ray groups on 2 cores (the run
    # took 69 s in all), so the limit leaves room for a loaded machine (a pids failure is an error, not a
    # hang).
    async def one() -> ExecResult:
        async with make(Limits(wall_s=120, memory_bytes=512 * MiB, max_processes=16)) as sb:
            return await sb.run(code)

    results = await asyncio.gather(*(one() for _ in range(32)))
    assert all(r.status is ToolStatus.OK for r in results), [r for r in results if not r.ok][:2]
    assert all(r.stdout.startswith("500.0") for r in results)


async def test_52_same_port_in_parallel(make):
    code = (
        "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', 8000)); s.listen(); print('bound')"
    )
    async with make() as a, make() as b:
        ra, rb = await asyncio.gather(a.run(code), b.run(code))
    assert ra.stdout == rb.stdout == "bound\n"


@pytest.mark.slow
async def test_53_noisy_neighbours_do_not_break_benign_calls(make):
    hostile = [
        "while True: pass",
        "import os\nwhile True: os.fork()",
        "a=[]\nwhile 1: a.append(b'x'*10**7)",
        "while True: print('A'*1000)",
    ]

    async def bad(code: str) -> ExecResult:
        async with make() as sb:
            return await sb.run(code, timeout=3)

    async def good(i: int) -> bool:
        async with make() as sb:
            r = await sb.run(f"print({i})")
            return r.status is ToolStatus.OK and r.stdout == f"{i}\n"

    results = await asyncio.gather(*(bad(c) for c in hostile), *(good(i) for i in range(60)))
    assert all(results[len(hostile) :]), "a benign call failed next to hostile ones"
    assert not any(r.status is ToolStatus.SANDBOX_ERROR for r in results[: len(hostile)])
