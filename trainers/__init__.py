"""Trainers and the ``agentrl`` command (``trainers/`` in the repository, installed as ``agentrl.trainers``).

:mod:`~agentrl.trainers.train` is the trainer (``agentrl train``), :mod:`~agentrl.trainers.cli` the command
line, :mod:`~agentrl.trainers.evaluate` ``agentrl eval``; :mod:`~agentrl.trainers.ray` runs the same loop on
Ray (``--ray``), :mod:`~agentrl.trainers.replay` re-runs recorded episodes and
:mod:`~agentrl.trainers.gateway` serves the recording gateway. Nothing in the library imports this package.

Two modules were renamed (#41): ``agentrl.trainers.pg`` is :mod:`~agentrl.trainers.train` and the package
``agentrl.trainers.distributed`` is :mod:`~agentrl.trainers.ray`. The old names stay importable until
:data:`~agentrl.errors.SHIMS_REMOVED_IN` through :data:`MOVED_MODULES`: each old dotted name *is* the new
module object (one entry in ``sys.modules`` under both names), so ``unittest.mock.patch`` on an old name
patches the real object, and a pickle that names an old module path still loads. There are no files at the
old paths, so that git follows the renames in history and merges.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

MOVED_MODULES: dict[str, str] = {
    "agentrl.trainers.pg": "agentrl.trainers.train",
    "agentrl.trainers.distributed": "agentrl.trainers.ray",
}
"""Old module name → its new name; a name under an old package maps under the new one
(``agentrl.trainers.distributed.runtime`` → ``agentrl.trainers.ray.runtime``). Goes in agentrl 0.2.0
(:data:`~agentrl.errors.SHIMS_REMOVED_IN`; CHANGELOG.md, "Migration shims")."""


def moved_to(name: str) -> str | None:
    """The new name of module ``name`` if it was renamed (:data:`MOVED_MODULES`), else ``None``."""
    for old, new in MOVED_MODULES.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an import of an old module name with the module already imported under its new name. No
    warning: pytest turns warnings into errors, and the CHANGELOG carries the notice."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = moved_to(fullname)
        if new is None or importlib.util.find_spec(new) is None:
            return None  # not renamed, or no such module under the new name either: Python's own error
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        spec.loader_state = new
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        """The module imported under its new name: it keeps its ``__name__`` and ``__path__``, so its
        submodules, classes and pickles all carry the new name."""
        module = importlib.import_module(str(spec.loader_state))
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run, the module is imported already; give it back its own ``__spec__``, which the import
        system has just overwritten with the old name's."""
        module.__spec__ = self._specs.pop(module.__spec__.name if module.__spec__ else "", module.__spec__)


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    # First: an old package name is the new package, whose __path__ the path finder would otherwise search
    # for the old submodule name, loading a second copy of the new module under the old name.
    sys.meta_path.insert(0, _MovedModules())
