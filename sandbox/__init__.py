"""Sandboxed Python execution for tool calls (installs as ``agentrl.sandbox``).

Backends share one contract (:class:`agentrl.protocols.Sandbox`): ``LocalSandbox`` (bubblewrap on this
machine, the default), ``DockerSandbox`` (a container from a local image, the ``docker`` SDK) and
``E2BSandbox`` (e2b's cloud, ``e2b-code-interpreter``). ``SandboxPool`` keeps warm sandboxes and applies
back-pressure; ``rollout_pool`` builds the one a run's episodes share. ``ProcessSandbox`` runs a long-lived
program (an MCP server) with pipes in the local sandbox. The docker and e2b SDKs are imported only when those
backends start. See ``sandbox/README.md`` for the threat model.
"""

from agentrl.execution import ExecResult, Limits
from agentrl.types import ToolStatus

from ._reaper import release as release_cgroups
from .docker import DockerSandbox
from .e2b import E2BSandbox
from .local import LIMIT_NAMES, LocalSandbox, self_test
from .pool import PoolStats, SandboxPool, rollout_pool
from .process import ProcessSandbox, SandboxedProcess
from .selftest import SelfTestReport

__all__ = [
    "LIMIT_NAMES",
    "DockerSandbox",
    "E2BSandbox",
    "ExecResult",
    "Limits",
    "LocalSandbox",
    "PoolStats",
    "ProcessSandbox",
    "SandboxPool",
    "SandboxedProcess",
    "SelfTestReport",
    "ToolStatus",
    "release_cgroups",
    "rollout_pool",
    "self_test",
]
