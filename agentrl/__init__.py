"""agentrl: multi-turn, tool-using reinforcement learning for language models.

Core contracts live here; plug-ins install under ``agentrl.envs``, ``agentrl.tools``, ``agentrl.sandbox``
and ``agentrl.trainers``. Heavy modules (``agentrl.credit``, ``agentrl.learner``, ``agentrl.policies``) are
imported explicitly by what needs them, so ``import agentrl`` stays light. It has no side effects either:
environment plug-ins load on the first ``make``/``list_envs``, and Gymnasium's registry is written only by
``register_gymnasium()``.
"""

from agentrl.checker import check_env
from agentrl.env import Env, Observation, StepResult, as_step_result
from agentrl.errors import AgentRLError
from agentrl.execution import ExecResult, ExecStatus, Limits
from agentrl.groups import TrajectoryGroup, group_trajectories
from agentrl.protocols import (
    FinishReason,
    Generation,
    Policy,
    Sampling,
    Sandbox,
    SandboxSource,
    Tool,
    ToolContext,
    ToolOutput,
    TrajectoryStore,
    UpdatablePolicy,
    WeightSink,
    WeightUpdate,
)
from agentrl.registry import EnvSpec, GymnasiumEnv, list_envs, make, register, register_gymnasium, spec
from agentrl.store import JsonlStore, read_groups, read_trajectories
from agentrl.types import (
    Action,
    EpisodeFailure,
    Message,
    Segment,
    StopReason,
    TokenSource,
    ToolCall,
    ToolRecord,
    ToolStatus,
    Trajectory,
    TrajectoryMeta,
)

__version__ = "0.1.0"

__all__ = [
    "Action",
    "AgentRLError",
    "Env",
    "EnvSpec",
    "EpisodeFailure",
    "ExecResult",
    "ExecStatus",
    "FinishReason",
    "Generation",
    "GymnasiumEnv",
    "JsonlStore",
    "Limits",
    "Message",
    "Observation",
    "Policy",
    "Sampling",
    "Sandbox",
    "SandboxSource",
    "Segment",
    "StepResult",
    "StopReason",
    "TokenSource",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolOutput",
    "ToolRecord",
    "ToolStatus",
    "Trajectory",
    "TrajectoryGroup",
    "TrajectoryMeta",
    "TrajectoryStore",
    "UpdatablePolicy",
    "WeightSink",
    "WeightUpdate",
    "__version__",
    "as_step_result",
    "check_env",
    "group_trajectories",
    "list_envs",
    "make",
    "read_groups",
    "read_trajectories",
    "register",
    "register_gymnasium",
    "spec",
]
