"""An OpenAI-compatible recording gateway: train agents written against the ``openai`` client.

An agent points its client at ``http://HOST:PORT/s/<session_id>/v1``; every request is rendered with the
policy's chat template, checked to extend the session's previous request, and answered by the policy (token
in, token out). ``POST /s/<session_id>/finish`` with the reward records the session as trajectories in the
same format as native rollouts (``agentrl replay`` reads them, the token audit passes on them).

* :class:`Gateway` — the server, as an async context manager (``agentrl gateway`` serves one until stopped).
* :class:`GatewayCore` — the same without HTTP; :class:`GatewayConfig` — its settings.
* :mod:`~agentrl.trainers.gateway.agent_rollout` — ``agentrl train --agent FILE.py:FUNC``.

See docs/gateway.md.
"""

from .core import GatewayCore
from .server import Gateway, build_app
from .session import GatewayConfig, Session
from .wire import ChatRequest, GatewayError, WireMessage, parse_chat_request

__all__ = [
    "ChatRequest",
    "Gateway",
    "GatewayConfig",
    "GatewayCore",
    "GatewayError",
    "Session",
    "WireMessage",
    "build_app",
    "parse_chat_request",
]
