"""The one error tree of agentrl.

Every exception agentrl raises derives from :class:`AgentRLError`. Where a builtin exception has the same
meaning, the class also derives from it, so existing ``except ValueError`` clauses keep working::

    AgentRLError
    ├── ConfigError (ValueError)            bad argument, config value or combination (raised up front)
    │   └── MigrationError (TypeError)      an argument an earlier release took and this one removed; the
    │                                       message says what replaces it (CHANGELOG.md)
    ├── MovedError (ImportError)            a name imported from the module an earlier release kept it in;
    │                                       the message names its new home
    ├── FormatError (ValueError)            data in a wire format is malformed (an OpenAI message or tool-call
    │                                       dict, a record of a trajectory read back)
    ├── EnvNotFoundError (KeyError)         agentrl.make() with an id nobody registered
    ├── EnvContractError (TypeError)        an Env broke the contract (wrong return shape, step after the end)
    ├── EpisodeError                        something went wrong *inside* an episode; becomes data on the
    │   │                                   Trajectory (errors + stop reason), the episode is still recorded
    │   ├── ToolCallError                   the model's tool call was unusable (bad JSON, unknown tool, args)
    │   │   └── CalculatorError (ValueError)  the calculator's expression is not arithmetic or is too large
    │   └── TemplateError                   the chat template is not append-only for this conversation
    ├── InfraError                          the machinery failed, not the model; never scored as reward 0:
    │   │                                   trajectories carrying one are marked ``infra_failure`` and dropped
    │   ├── SandboxError (RuntimeError)     the sandbox could not run the code (start failed, busy, crashed)
    │   │   └── SandboxSelfTestError        a resource limit did not trip during the startup self-test
    │   ├── PolicyError (RuntimeError)      generation failed (server down, engine crashed)
    │   └── JudgeError (RuntimeError)       a reward judge failed (down, errors past retries, no verdict)
    ├── StoreError (OSError)                the trajectory store could not be read or written
    │   └── SchemaError (FormatError)       a stored record does not match the schema it claims (names the
    │                                       file and line)
    └── AuditError (AssertionError)         a trajectory's tokens, mask and log-probs disagree

Rule of thumb: ``EpisodeError`` subclasses are the model's or the environment's business and are recorded;
``InfraError`` subclasses are ours and mark the episode unusable for training; everything else is raised to
the caller.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = [
    "SHIMS_REMOVED_IN",
    "AgentRLError",
    "AuditError",
    "CalculatorError",
    "ConfigError",
    "EnvContractError",
    "EnvNotFoundError",
    "EpisodeError",
    "FormatError",
    "InfraError",
    "JudgeError",
    "MigrationError",
    "MovedError",
    "PolicyError",
    "SandboxError",
    "SandboxSelfTestError",
    "SchemaError",
    "StoreError",
    "TemplateError",
    "ToolCallError",
    "removed_arguments",
]

_C = TypeVar("_C", bound=type)


class AgentRLError(Exception):
    """Root of every exception raised by agentrl."""


class ConfigError(AgentRLError, ValueError):
    """A bad argument, configuration value or combination of settings."""


class MigrationError(ConfigError, TypeError):
    """Code written for an earlier release passed an argument this one removed; the message says what
    replaces it. A ``TypeError`` too, as Python's own error for an unknown keyword was."""


class MovedError(AgentRLError, ImportError):
    """A name was imported from the module an earlier release kept it in; the message names its new home.
    An ``ImportError``, so ``try: from old import x / except ImportError: from new import x`` works."""


SHIMS_REMOVED_IN = "0.2.0"
"""The release that drops the migration shims of the current round: the :class:`MigrationError` of every
:func:`removed_arguments`, the :class:`MovedError` of every moved name, and the attribute hints. After it, an
old spelling gets Python's own error. Each shim's message says so; CHANGELOG.md ("Migration shims") lists
them."""


def removed_arguments(removed: Mapping[str, str], *, until: str = SHIMS_REMOVED_IN) -> Callable[[_C], _C]:
    """Class decorator (above ``@dataclass`` where there is one): calling the class with a keyword in
    ``removed`` raises :class:`MigrationError` with the migration text ``removed[name]``, instead of Python's
    bare ``TypeError: unexpected keyword argument``. The signature seen by ``inspect`` (and tyro) is kept.
    ``until``: the release that removes this shim (named in the message)."""

    def decorate(cls: _C) -> _C:
        init: Callable[..., None] = cls.__init__  # type: ignore[misc]  # the class's own, not an instance's

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            gone = sorted(kwargs.keys() & removed.keys())
            if gone:
                raise MigrationError(
                    f"{type(self).__name__}: the {gone[0]}= argument was removed; {removed[gone[0]]} "
                    "(CHANGELOG.md lists every change that breaks earlier code, with its migration; this "
                    f"message goes in agentrl {until})"
                )
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[misc]  # the wrapper replaces the generated __init__
        return cls

    return decorate


class FormatError(AgentRLError, ValueError):
    """Data in a wire format (OpenAI messages and tool calls, trajectory records) is malformed."""


class EnvNotFoundError(AgentRLError, KeyError):
    """No environment is registered under the requested id."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable.
        return str(self.args[0]) if self.args else ""


class EnvContractError(AgentRLError, TypeError):
    """An environment returned something the ``Env`` contract does not allow."""


class EpisodeError(AgentRLError):
    """A failure inside an episode; recorded on the trajectory rather than raised to the trainer."""


class ToolCallError(EpisodeError):
    """The model's tool call could not be parsed or executed as asked (the model can recover)."""


class CalculatorError(ToolCallError, ValueError):
    """The calculator tool's expression is not valid arithmetic, or it is too large to compute."""


class TemplateError(EpisodeError):
    """The chat template is not append-only for this conversation (render-all != prefix + delta)."""


class InfraError(AgentRLError):
    """The machinery failed, not the model. Episodes hit by one are never scored as reward 0."""


class SandboxError(InfraError, RuntimeError):
    """The sandbox could not run code: it failed to start, crashed, or is saturated."""


class SandboxSelfTestError(SandboxError):
    """A resource limit did not trip during the sandbox's startup self-test."""


class PolicyError(InfraError, RuntimeError):
    """The policy backend failed to generate."""


class JudgeError(InfraError, RuntimeError):
    """A judge model could not score (unreachable, errors past its retries and deadline, answers nothing
    parsable every time): the episode is dropped as an infrastructure failure, never rewarded 0."""


class StoreError(AgentRLError, OSError):
    """The trajectory store could not be read or written."""


class SchemaError(StoreError, FormatError):
    """A stored record does not match its schema version (or is corrupt); the message names file and line."""


class AuditError(AgentRLError, AssertionError):
    """A trajectory's token ids, loss mask, log-probs or provenance disagree."""
