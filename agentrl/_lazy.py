"""Package attributes loaded on first use (PEP 562 ``__getattr__``).

Packages whose heavy parts import torch (``agentrl.credit``, ``agentrl.learner``, ``agentrl.policies``,
``agentrl.trainers.factories``, ``agentrl.trainers.replay``) keep every public name where it was but import
the module behind it only when the name is first read, so a process that never computes with them (a Ray
rollout worker, ``agentrl envs``) does not pay for torch. Each such package names its lazy attributes in a
``{name: module}`` table and defines ``def __getattr__(name): return load(__name__, TABLE, name)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["load"]


def load(package: str, where: Mapping[str, str], name: str) -> Any:
    """Attribute ``name`` of the module ``where`` names for it.

    Raises:
        AttributeError: ``name`` is not in ``where`` (as for any missing module attribute).
    """
    if name in where:
        return getattr(importlib.import_module(where[name]), name)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
