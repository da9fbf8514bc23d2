"""What a program started in the process sandbox needs of the host, beyond ``/usr`` and agentrl's Python.

A published MCP server is usually installed in a venv of its own (``pip install mcp-server-time`` gives a
console script whose first line names that venv's ``python``) or in an npm prefix (``node_modules``). The
sandbox shows nothing of the host but ``/usr``, agentrl's interpreter and ``ro_binds``, so such a program
could not even be exec'ed. :func:`program_layout` follows the command the way the kernel and the
interpreters will: the program's symlinks, its ``#!`` line (through ``/usr/bin/env``, and pip's
``/bin/sh`` trampoline for long paths), a venv's ``pyvenv.cfg`` ``home`` (the base Python) and the
``node_modules`` tree a script lives in (or the npm prefix folder named on the command line), and returns
those installations' roots to bind read-only. A path it cannot place in a known layout is not guessed at
(binding a whole home directory would expose far more than the program needs):
:class:`~agentrl.errors.ConfigError` names it and the ``ro_binds=`` fix.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agentrl.errors import ConfigError

__all__ = ["SANDBOX_PATH", "SYSTEM_DIRS", "ProgramLayout", "program_layout"]

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
"""Host directories every process sandbox shows (read-only)."""
SANDBOX_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
"""The sandbox's ``PATH`` (``/usr/bin/env NAME`` looks there)."""
_MAX_HOPS = 8  # interpreter chains are short (script -> python -> base python); a loop must not hang


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _interpreter(path: str) -> list[str] | None:
    """The ``#!`` line of ``path`` split into words (pip's ``/bin/sh`` trampoline resolved), else None."""
    try:
        with open(path, "rb") as f:
            head = f.read(1024)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    lines = head[2:].decode("utf-8", "replace").splitlines()
    words = lines[0].split() if lines else []
    # pip writes this when the venv's path is too long for a #! line or holds spaces:
    #   #!/bin/sh \n '''exec' "/long path/venv/bin/python" "$0" "$@" \n' '''
    if words == ["/bin/sh"] and len(lines) > 1 and lines[1].startswith("'''exec' "):
        try:
            return shlex.split(lines[1][len("'''exec' ") :])[:1]
        except ValueError:
            return None
    return words or None


def _on_sandbox_path(name: str) -> str | None:
    for d in SANDBOX_PATH:
        cand = os.path.join(d, name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _venv_root(path: str) -> str | None:
    """The venv ``path`` lies in (a folder above it holds ``pyvenv.cfg``), else None."""
    d = os.path.dirname(path)
    while d not in ("/", ""):
        if os.path.isfile(os.path.join(d, "pyvenv.cfg")):
            return d
        d = os.path.dirname(d)
    return None


def _venv_home(root: str) -> str | None:
    """The base Python's ``bin`` folder a venv names (``home = ...`` in its ``pyvenv.cfg``)."""
    try:
        with open(os.path.join(root, "pyvenv.cfg"), encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.partition("=")
                if sep and key.strip() == "home":
                    return value.strip() or None
    except OSError:
        return None
    return None


def _python_prefix(path: str) -> str | None:
    """The installation prefix of a Python whose executable is ``path`` (``PREFIX/bin/python3.X`` with a
    ``PREFIX/lib/python3.*`` standard library), else None."""
    prefix = os.path.dirname(os.path.dirname(path))
    lib = os.path.join(prefix, "lib")
    try:
        if any(n.startswith("python3") for n in os.listdir(lib)):
            return prefix
    except OSError:
        pass
    return None


def _node_modules_root(path: str) -> str | None:
    """The outermost ``node_modules`` folder above ``path`` (Node resolves a package's imports there)."""
    parts = path.split("/")
    if "node_modules" not in parts:
        return None
    return "/".join(parts[: parts.index("node_modules") + 1])


def _missing(path: str, why: str) -> ConfigError:
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    return ConfigError(
        f"the sandbox cannot see {path} ({why}); it shows only /usr, agentrl's own Python and ro_binds. "
        f"Pass it: launcher=ProcessSandbox(Limits(), ro_binds=[{folder!r}]) (agentrl.sandbox), or "
        "sandboxed=False for a server you trust"
    )


@dataclass(frozen=True)
class ProgramLayout:
    """What :func:`program_layout` found for one command."""

    binds: tuple[str, ...]
    """New host folders to bind read-only (venvs, base Pythons, ``node_modules`` trees)."""
    interpreter: str
    """The real path of the binary that finally runs (``/usr/bin/node``, a venv's base ``python3.11``)."""

    @property
    def is_node(self) -> bool:
        """True when Node.js runs the program (V8 reserves address space a Python server does not)."""
        return os.path.basename(self.interpreter).startswith(("node", "nodejs"))


def program_layout(argv: Sequence[str], visible: Sequence[str]) -> ProgramLayout:
    """Host folders to bind read-only so that ``argv`` can run in the sandbox, and its final interpreter.

    Args:
        argv: the command, its program an absolute path.
        visible: what the sandbox binds already (agentrl's Python, ``ro_binds``, the command's files).

    Returns:
        The new roots to bind (the venvs, base Python installations and ``node_modules`` trees the program,
        its interpreter chain and the files on its command line live in) and the binary that runs.

    Raises:
        ConfigError: a program or interpreter in the chain does not exist, or lies outside every layout this
            function recognizes and outside ``visible``: the message names the path and the ``ro_binds=`` fix.
    """
    binds: list[str] = []

    def seen(p: str) -> bool:
        return _under(p, SYSTEM_DIRS) or _under(p, visible) or _under(p, binds)

    def add_layouts(p: str, *, program: bool = True) -> None:
        """Bind the venv / Python / node_modules installation ``p`` belongs to, if any (a Python prefix
        only for a program: a data file beside a ``lib/python3*`` folder is no interpreter)."""
        venv = _venv_root(p)
        if venv is not None and not seen(venv):
            binds.append(venv)
        if venv is not None:
            home = _venv_home(venv)
            if home is not None and not seen(home):
                base = _python_prefix(os.path.join(home, "python3")) or home
                if not os.path.isdir(base):
                    raise _missing(
                        base, f"the base Python that {venv}/pyvenv.cfg names, which does not exist"
                    )
                binds.append(base)
        modules = _node_modules_root(p)
        if modules is not None and not seen(modules):
            binds.append(modules)
        if program and not seen(p):
            prefix = _python_prefix(p)
            if prefix is not None:
                binds.append(prefix)

    program = real = argv[0]
    for _ in range(_MAX_HOPS):
        if not os.path.exists(program):
            raise _missing(program, "it does not exist on the host either")
        # Each link on the way must resolve inside the sandbox too: bind the layout of every hop.
        hop = program
        for _ in range(_MAX_HOPS):
            add_layouts(hop)
            if not os.path.islink(hop):
                break
            hop = os.path.join(os.path.dirname(hop), os.readlink(hop))
            hop = os.path.normpath(hop)
        real = os.path.realpath(program)
        add_layouts(real)
        if not seen(real):
            raise _missing(real, f"the program {argv[0]!r} runs it")
        words = _interpreter(real)
        if not words:
            break
        if os.path.basename(words[0]) == "env":
            names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
            if not names:
                break
            found = _on_sandbox_path(names[0])
            if found is None:
                raise ConfigError(
                    f"{real} starts with '#!{' '.join(words)}', but {names[0]!r} is not on the sandbox's "
                    f"PATH ({':'.join(SANDBOX_PATH)}); name its interpreter first in the command instead"
                )
            program = found
        else:
            program = words[0]
    for arg in argv[1:]:
        if os.sep in arg and os.path.isdir(arg) and not seen(os.path.abspath(arg)):
            # An npm prefix named on the command line (``npx --prefix DIR``): npm reads it whole.
            if any(os.path.exists(os.path.join(arg, n)) for n in ("node_modules", "package.json")):
                binds.append(os.path.abspath(arg))
        elif os.sep in arg and os.path.exists(arg):
            add_layouts(os.path.abspath(arg), program=False)
            add_layouts(os.path.realpath(arg), program=False)
    return ProgramLayout(tuple(binds), os.path.realpath(real))
