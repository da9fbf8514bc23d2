"""The REPL worker that runs *inside* a sandbox (local bubblewrap namespace or Docker container).

This file is never imported by the host in the usual way: the host compiles it, marshals the code object and
sends it down the control channel to a two-line bootstrap (``python -I -S -c BOOTSTRAP``), so the sandbox
needs no copy of the package and the interpreter starts without ``site`` (fast). Stdlib only, and only
cheap built-in modules at start-up: one-shot sandboxes pay for every import here.

Protocol (the host is trusted, the code the worker runs is not):

* host -> worker, on the control fd: frames of a 4-byte big-endian length and a ``marshal``-ed dict. The
  first frame is the configuration, then ``{"op": "run", "id", "code", "wall"}`` or ``{"op": "exit"}``.
* worker -> host: one short ASCII JSON line per frame. Its fields come from fixed sets (never user text),
  so the worker needs no ``json`` module. In ``fd`` mode the line goes to a separate result fd; user code
  printing to stdout/stderr cannot corrupt it (it can only forge its *own* result by writing to that fd on
  purpose). In ``sentinel`` mode (Docker exec has only three streams) a marker carrying a per-call nonce is
  written to stdout and to stderr, followed on stderr by the result line.

User stdout/stderr are the real fds 1 and 2, so output of subprocesses and C code is captured too; the host
reads, caps and decodes them.
"""

# ruff: noqa: UP031  (plain %-formatting: the worker avoids anything it does not need)
# mypy: ignore-errors

import _ast
import io
import os
import signal
import sys

_pid = os.getpid()
_cfg = {"ctl_fd": int(sys.argv[2]) if len(sys.argv) > 2 else 3}
_ns = {}
_sources = {}
_out = None
_err = None
_old_threads = frozenset()
_n_cells = 0


def _send(line):
    """Write one result line (ASCII) to the host."""
    data = (line + "\n").encode("ascii")
    if _cfg.get("mode") == "sentinel":
        marker = _cfg["marker"] + _cfg_nonce[0]
        os.write(1, marker.encode("ascii"))
        os.write(2, marker.encode("ascii") + data)
    else:
        os.write(_cfg["res_fd"], data)


_cfg_nonce = [""]


def _recv():
    """Read one framed request from the host; exit when the host is gone."""
    fd = _cfg.get("ctl_fd", 3)
    head = _read_exact(fd, 4)
    n = int.from_bytes(head, "big")
    import marshal

    return marshal.loads(_read_exact(fd, n))


def _read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = os.read(fd, n - len(buf))
        except InterruptedError:
            continue
        except OSError:
            os._exit(70)
        if not chunk:
            os._exit(0)  # host closed the channel: nothing left to do
        buf += chunk
    return bytes(buf)


class _Stream(io.TextIOWrapper):
    """stdout/stderr of the cell: drops writes from threads that an *earlier* cell started, so late
    output of a background thread never lands in another call's result (catalogue case 37)."""

    def write(self, s):
        if _old_threads:
            threading = sys.modules.get("threading")
            if threading is not None and threading.current_thread() in _old_threads:
                return len(s)
        return super().write(s)


def _make_stream(fd):
    raw = io.FileIO(fd, "w", closefd=False)
    return _Stream(raw, encoding="utf-8", errors="backslashreplace", line_buffering=True)


def _apply_rlimits(limits):
    """Lower the worker's own rlimits before any untrusted code runs; report the ones that failed."""
    import resource

    failed = []
    for name, value in limits.items():
        res = getattr(resource, "RLIMIT_" + name, None)
        if res is None:
            failed.append(name)
            continue
        try:
            resource.setrlimit(res, (value, value))
        except (OSError, ValueError):
            failed.append(name)
    return failed


def _set_cpu_budget(wall):
    """Backstop for a host that stopped watching: the CPU rlimit allows this cell about its wall time."""
    import resource

    try:
        r = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(r.ru_utime + r.ru_stime + wall) + 2
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (OSError, ValueError):
        pass


def _reap_strays():
    """Kill every other process in the sandbox's PID namespace (one atomic kill(-1), not a child walk),
    then reap our own children. Only ever called when the worker is PID 1 or 2 of its own namespace."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    while True:
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if pid == 0:
            return


def _print_exception(exc, skip_frames):
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None:
            tb = tb.tb_next
    try:
        import linecache
        import traceback

        for name, src in _sources.items():
            linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        traceback.print_exception(type(exc), exc, tb, file=_err)
    except BaseException:  # a hostile __str__ or an exhausted heap must not take the worker down
        try:
            _err.write("%s (the traceback could not be printed)\n" % type(exc).__name__)
        except BaseException:
            pass


def _remember_source(name, code):
    _sources[name] = code
    # Bound the memory spent on tracebacks: keep the most recent cells only.
    while len(_sources) > 256:
        _sources.pop(next(iter(_sources)))


def _run_cell(code):
    """Run one cell in the persistent namespace; return (status, exit_code)."""
    global _n_cells
    _n_cells += 1
    name = "<cell-%d>" % _n_cells
    try:
        tree = compile(code, name, "exec", _ast.PyCF_ONLY_AST)
    except BaseException as exc:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
        _remember_source(name, code)
        # Skip this function's own frame: what the model reads must not depend on the worker's source.
        _print_exception(exc, 1)
        return ("oom" if isinstance(exc, MemoryError) else "error"), None
    _remember_source(name, code)
    try:
        last = None
        if tree.body and isinstance(tree.body[-1], _ast.Expr):
            last = tree.body.pop()
        if tree.body:
            exec(compile(tree, name, "exec"), _ns)
        if last is not None:
            value = eval(compile(_ast.Expression(last.value), name, "eval"), _ns)
            if value is not None:
                _ns["_"] = value
                _out.write(repr(value) + "\n")
    except SystemExit as exc:
        code = exc.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code & 0xFF
        else:
            try:
                _err.write(str(code) + "\n")
            except BaseException:
                pass
            status = 1
        return "exit", status
    except BaseException as exc:
        _print_exception(exc, 1)
        return ("oom" if isinstance(exc, MemoryError) else "error"), None
    return "ok", None


class _Quitter:
    """``exit()``/``quit()`` as the ``site`` module provides them (it is not loaded: ``-S``)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "Use %s() or Ctrl-D (i.e. EOF) to exit" % self.name

    def __call__(self, code=None):
        raise SystemExit(code)


def _install_quitters():
    import builtins

    builtins.exit = _Quitter("exit")
    builtins.quit = _Quitter("quit")


def _flush():
    for stream in (_out, _err):
        try:
            stream.flush()
        except BaseException:
            pass


def _main():
    global _out, _err, _old_threads, _ns
    _cfg.update(_recv())
    if _cfg.get("mode") == "sentinel":
        # Requests arrive on stdin: move them to a private fd and give the code an empty stdin.
        ctl = os.dup(0)
        os.set_inheritable(ctl, False)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        _cfg["ctl_fd"] = ctl
    else:
        for fd in (_cfg["ctl_fd"], _cfg["res_fd"]):
            os.set_inheritable(fd, False)  # subprocesses of user code must not hold the channel
    failed = _apply_rlimits(_cfg.get("rlimits", {}))
    for path in _cfg.get("sys_path", ()):
        if path not in sys.path:
            sys.path.append(path)
    _out = _make_stream(1)
    _err = _make_stream(2)
    # User code gets a fresh __main__; the worker's own globals stay out of its namespace.
    module = type(sys)("__main__")
    module.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = module
    _ns = module.__dict__
    kill_strays = bool(_cfg.get("kill_strays")) and os.getpid() in (1, 2)
    _install_quitters()
    _send('{"ready":1,"pid":%d,"failed":[%s]}' % (os.getpid(), ",".join('"%s"' % f for f in failed)))
    while True:
        req = _recv()
        op = req.get("op")
        if op == "exit":
            os._exit(0)
        if op != "run":
            continue
        _cfg_nonce[0] = str(req.get("nonce", ""))
        # Every cell starts with the worker's own streams, whatever an earlier cell did to sys.stdout.
        sys.stdout = sys.__stdout__ = _out
        sys.stderr = sys.__stderr__ = _err
        threading = sys.modules.get("threading")
        if threading is not None:
            main = threading.main_thread()
            _old_threads = frozenset(t for t in threading.enumerate() if t is not main)
        else:
            _old_threads = frozenset()
        _set_cpu_budget(float(req.get("wall", 10.0)))
        status, exit_code = _run_cell(req["code"])
        if os.getpid() != _pid:
            # A fork() of the worker made by the code came back here: it must never answer or read.
            _flush()
            os._exit(1)
        _flush()
        if kill_strays:
            _reap_strays()
        if status == "exit":
            _send('{"id":%d,"status":"exit","exit_code":%d}' % (req["id"], exit_code))
            os._exit(exit_code)
        _send('{"id":%d,"status":"%s"}' % (req["id"], status))


_main()
