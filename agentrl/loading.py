"""Load a Python object named by reference: ``path/to/file.py:Name`` or ``package.module:Name``.

One loader for everything a user names on the command line (an environment class for ``--env``, an agent
function for ``--agent``). A file is imported once per process under a stable module name derived from its
absolute path, so a second lookup returns the same objects (an env class registered at import time is not
registered twice) and the name is the same in every process that loads the file (pickling, Ray workers).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from agentrl.errors import ConfigError

__all__ = ["is_file_reference", "load_module", "load_object", "split_reference"]

_FILE_MODULES: dict[str, ModuleType] = {}


def split_reference(ref: str) -> tuple[str, str]:
    """``"where:Name"`` as ``(where, Name)``; the last ``:`` separates them (a path may hold one)."""
    where, sep, name = ref.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"{ref!r} is not a reference: expected path/to/file.py:Name or package.module:Name")
    return where, name


def is_file_reference(where: str) -> bool:
    """A file path (ends in ``.py`` or holds a path separator) rather than a dotted module name."""
    return where.endswith(".py") or "/" in where or "\\" in where


def load_module(where: str) -> ModuleType:
    """Import ``where``: a ``.py`` file (once per process; its folder is put on ``sys.path`` first, as for a
    script) or a module importable from ``sys.path``.

    Raises :class:`ConfigError` saying what was tried and why it failed.
    """
    if is_file_reference(where):
        return _load_file(Path(where))
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", where):
        raise ConfigError(f"{where!r} is neither a .py file path nor a dotted module name")
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as e:
        hint = ""
        if (Path.cwd() / where.split(".")[0]).exists() or Path(f"{where.split('.')[0]}.py").exists():
            hint = (
                " (it is in the current directory, which the agentrl command does not put on sys.path: "
                "run with PYTHONPATH=. or name the file, path/to/file.py:Name)"
            )
        raise ConfigError(f"tried to import the module {where!r}: {e}{hint}") from e
    except Exception as e:
        raise ConfigError(f"importing the module {where!r} raised {type(e).__name__}: {e}") from e


def _load_file(file: Path) -> ModuleType:
    path = file.expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"tried to load the file {str(file)!r}: {path} does not exist or is not a file")
    key = str(path)
    module = _FILE_MODULES.get(key)
    if module is not None:
        return module
    stem = re.sub(r"\W", "_", path.stem)
    name = f"agentrl_user_{stem}_{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"tried to load the file {key!r}: Python cannot import it as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    # As Python does for a script: the file's folder goes first on sys.path, so a module beside it imports
    # (and stays importable: the file may import it lazily, later).
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ConfigError(f"importing the file {key!r} raised {type(e).__name__}: {e}") from e
    _FILE_MODULES[key] = module
    return module


def load_object(ref: str) -> object:
    """The object ``Name`` of ``where`` in ``where:Name`` (see :func:`load_module`)."""
    where, name = split_reference(ref)
    module = load_module(where)
    try:
        return getattr(module, name)
    except AttributeError:
        public = sorted(k for k in vars(module) if not k.startswith("_"))
        raise ConfigError(f"{where!r} has no {name!r} (it defines {public[:20]})") from None
