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
import functools
import json
import os
import signal
from pathlib import Path
from typing import Any

from agentrl.config import add_config_arguments, config_from_args, config_to_dict
from agentrl.errors import ConfigError

from .serve_config import ServeConfig
from .session import GatewayConfig

__all__ = ["API_KEY_ENV", "ServeConfig", "add_parser", "run", "serve"]

API_KEY_ENV = "AGENTRL_GATEWAY_API_KEY"
"""The environment variable that gives ``agentrl gateway`` its key when --api-key is not set."""


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
    add_config_arguments(p, TrainConfig)  # with --train (live training); refused without it
    add_config_arguments(p, ServeConfig)  # last: a flag both configs define keeps the gateway's name
    return p


_SERVE_FLAGS = frozenset(f.name for f in dataclasses.fields(ServeConfig))


@functools.cache
def _train_flags() -> tuple[dict[str, str], dict[str, str]]:
    """The training config's flags by destination (``output.steps`` -> ``--steps``), and the destinations of
    the flags both configs define (--model, --out, --seed, --device, --dtype), gateway name -> training name:
    the parser keeps the gateway's action for those (added last, ``conflict_handler="resolve"``)."""
    from agentrl.trainers.train_setup import TrainConfig

    def actions(cls: Any) -> list[argparse.Action]:
        p = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
        add_config_arguments(p, cls)
        return [a for a in p._actions if a.option_strings and a.dest != "help"]

    train = actions(TrainConfig)
    flag = {a.dest: a.option_strings[-1] for a in train}
    by_option = {o: a.dest for a in train for o in a.option_strings}
    shared = {a.dest: by_option[o] for a in actions(ServeConfig) for o in a.option_strings if o in by_option}
    return flag, {k: v for k, v in shared.items() if k != v}


def run(ns: argparse.Namespace) -> int:
    """Run the ``gateway`` subcommand; returns the exit status."""
    cfg = config_from_args(ServeConfig, ns)
    given = {k for k in vars(ns) if k != "command"}
    flag, shared = _train_flags()
    if cfg.train:
        from agentrl.trainers.train_setup import TrainConfig

        from .live import live_train_config, train_live
        from .server import check_exposure

        values = vars(ns)
        for serve_dest, train_dest in shared.items():
            if serve_dest in values:  # one flag, both configs
                values[train_dest] = values[serve_dest]
        api_key = cfg.api_key or os.environ.get(API_KEY_ENV) or None
        check_exposure(cfg.host, api_key, allow_unauthenticated=cfg.allow_unauthenticated)  # before loading
        train = live_train_config(cfg, given, config_from_args(TrainConfig, ns, base=_live_defaults()))
        return train_live(cfg, train, api_key=api_key)
    training_only = sorted(flag.get(n, "--" + n.replace("_", "-")) for n in given - _SERVE_FLAGS)
    if training_only:
        flags = ", ".join(training_only)
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
        async with Gateway.from_serve_config(
            cfg, policy, renderer, gateway_cfg, store=store, api_key=api_key
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
