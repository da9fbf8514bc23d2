"""What a sandbox sees of the host, for the backends that run this machine's interpreter (local, Docker).

Both bind the host's ``/usr`` and this Python installation read-only at their own paths and start the
interpreter from there with an allow-listed environment; the self-test checks that environment from inside.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Mapping

from agentrl.errors import ConfigError
from agentrl.execution import Limits

__all__ = ["SANDBOX_UID", "python_layout", "sandbox_env"]

SANDBOX_UID = 1000
"""The unprivileged user (and group) id the code runs as inside the sandbox."""


def python_layout() -> tuple[str, list[str], list[str]]:
    """(interpreter path, host dirs to bind read-only, sys.path entries) for this interpreter.

    We exec the venv's ``bin/python`` (never a pyenv shim: +100 ms per start) and bind the venv and the
    base installation read-only at their own paths, so symlinks and ``pyvenv.cfg`` resolve inside.
    """
    exe = os.path.abspath(sys.executable)
    binds: list[str] = []
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        p = os.path.abspath(p)
        if not p.startswith("/usr/") and p != "/usr" and os.path.isdir(p):
            binds.append(p)
    real = os.path.realpath(exe)
    real_prefix = os.path.dirname(os.path.dirname(real))
    if not any(real.startswith(b + "/") for b in binds) and not real.startswith("/usr/"):
        binds.append(real_prefix)
    paths = sysconfig.get_paths()
    sys_path = []
    for key in ("purelib", "platlib"):
        site = paths.get(key)
        if site and os.path.isdir(site) and site not in sys_path:
            sys_path.append(site)
    # Drop nested duplicates so bwrap does not bind a directory twice.
    binds = sorted(set(binds))
    binds = [b for b in binds if not any(b != o and b.startswith(o + "/") for o in binds)]
    return exe, binds, sys_path


def sandbox_env(limits: Limits, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The sandbox's whole environment: an allow-list (paths, locale, one thread per math library) plus
    ``extra``; nothing is inherited from the host."""
    threads = str(limits.cpu_threads)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "PWD": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "NUMEXPR_NUM_THREADS": threads,
        "VECLIB_MAXIMUM_THREADS": threads,
        "RAYON_NUM_THREADS": threads,
    }
    if extra:
        for k, v in extra.items():
            if not isinstance(k, str) or not isinstance(v, str) or "=" in k or "\0" in k + v:
                raise ConfigError(f"sandbox env entries must be str -> str without '=' or NUL: {k!r}")
            env[k] = v
    return env
