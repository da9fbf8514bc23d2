"""agentrl: multi-turn, tool-using reinforcement learning for language models.

Core contracts live here; plug-ins install under ``agentrl.envs``, ``agentrl.tools``, ``agentrl.sandbox``
and ``agentrl.trainers``. Heavy modules (``agentrl.credit``, ``agentrl.learner``, ``agentrl.policies``) are
imported explicitly by what needs them, so ``import agentrl`` stays light.
"""

from agentrl.checker import check_env
from agentrl.env import INFO_ASSISTANT_MESSAGE, INFO_TOOL_RECORDS, Env, Observation, StepReturn
from agentrl.errors import AgentRLError
from agentrl.execution import ExecResult, ExecStatus, Limits
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
from agentrl.registry import EnvSpec, GymnasiumEnv, list_envs, make, register, spec
from agentrl.store import JsonlStore, read_trajectories
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
    "INFO_ASSISTANT_MESSAGE",
    "INFO_TOOL_RECORDS",
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
    "StepReturn",
    "StopReason",
    "TokenSource",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolOutput",
    "ToolRecord",
    "ToolStatus",
    "Trajectory",
    "TrajectoryMeta",
    "TrajectoryStore",
    "UpdatablePolicy",
    "WeightSink",
    "WeightUpdate",
    "__version__",
    "check_env",
    "list_envs",
    "make",
    "read_trajectories",
    "register",
    "spec",
]

# Register plug-in environments (agentrl.envs and third-party packages) so that gymnasium.make sees them.
from agentrl.registry import load_plugins as _load_plugins

_load_plugins()
