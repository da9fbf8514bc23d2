"""OpenAIPolicy: token-in/token-out generation through an OpenAI-compatible completions server.

The request sends the prompt as token ids to ``/v1/completions`` and asks for the sampled ids and their
log-probs. With vLLM (>= 0.10.2) that is ``return_token_ids=True`` (the choice then carries
``token_ids``) plus ``logprobs``; ``return_tokens_as_token_ids=True`` makes ``logprobs.tokens`` read
``"token_id:<id>"`` as a fallback source of ids. Start vLLM with ``--logprobs-mode processed_logprobs`` so
the log-probs are those of the tempered distribution actually sampled (the default, ``raw_logprobs``, is
before temperature). Servers that return neither ids form are rejected with a PolicyError rather than
re-tokenizing the text (pitfall §15.1).

When a tokenizer is given, the returned text is checked against the decoded ids; a disagreement means the
engine's ids are wrong (pitfall §15.5) and becomes a PolicyError.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.errors import ConfigError, PolicyError
from agentrl.protocols import FinishReason, Generation, Sampling

__all__ = ["OpenAIPolicy"]


class OpenAIPolicy:
    """A policy served by an OpenAI-compatible completions endpoint (vLLM ``serve``, SGLang, ...).

    Not a :class:`~agentrl.protocols.WeightSink`: the completions API has no route for weights. The server
    takes new weights out of band (a restart from a checkpoint, or the engine's own update mechanism), after
    which the caller reports the version with :meth:`set_version`; generations record it from then on.

    Args:
        base_url: Server URL including ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``).
        model: Model name as the server knows it.
        stop_token_ids: Ids that end a turn (sent as vLLM's ``stop_token_ids``); give the renderer the same.
        tokenizer: Optional; enables the text-vs-ids check.
        api_key: Sent as the bearer token (vLLM ignores it unless started with ``--api-key``).
        timeout: Seconds per request.
        max_retries: Retries of the openai client on connection errors and 5xx.
        extra_body: More fields for every request (e.g. ``{"top_k": 20}``).
        version: Initial weights version (call :meth:`set_version` once the server serves new weights).
        client: An ``openai.AsyncOpenAI`` to use instead of building one.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        stop_token_ids: Sequence[int] = (),
        tokenizer: Any = None,
        api_key: str = "EMPTY",
        timeout: float = 120.0,
        max_retries: int = 2,
        extra_body: Mapping[str, Any] | None = None,
        version: int = 0,
        client: Any = None,
    ):
        if not model:
            raise ConfigError("OpenAIPolicy needs the served model's name")
        if client is None:
            if not base_url:
                raise ConfigError("OpenAIPolicy needs base_url (e.g. http://127.0.0.1:8000/v1)")
            import openai

            client = openai.AsyncOpenAI(
                base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries
            )
        self.client = client
        self.model = model
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.tokenizer = tokenizer
        self.extra_body = dict(extra_body or {})
        self._version = int(version)

    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        """Record that the server now serves weights from learner step ``version``."""
        self._version = int(version)

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        import openai

        body: dict[str, Any] = {
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
        }
        if self.stop_token_ids:
            body["stop_token_ids"] = list(self.stop_token_ids)
        body.update(self.extra_body)
        version = self._version
        try:
            resp = await self.client.completions.create(
                model=self.model,
                prompt=list(prompt_ids),
                max_tokens=sampling.max_new_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                seed=sampling.seed,
                logprobs=1,
                n=1,
                extra_body=body,
            )
        except openai.OpenAIError as e:
            raise PolicyError(f"completions request to {self.model!r} failed: {e}") from e
        if not getattr(resp, "choices", None):
            raise PolicyError("the server returned no choices")
        return self._parse(resp.choices[0], version)

    def _parse(self, choice: Any, version: int) -> Generation:
        lp = getattr(choice, "logprobs", None)
        token_logprobs = list(getattr(lp, "token_logprobs", None) or [])
        ids = _field(choice, "token_ids")
        from_tokens = _ids_from_tokens(getattr(lp, "tokens", None))
        if ids is None:
            ids = from_tokens
        elif from_tokens is not None and list(from_tokens) != list(ids):
            raise PolicyError("the server's token_ids and logprobs.tokens disagree (engine-side id error)")
        if ids is None:
            raise PolicyError(
                "the server returned no token ids; agentrl never re-tokenizes sampled text. Use vLLM >= "
                "0.10.2 (return_token_ids) or a server that honours return_tokens_as_token_ids"
            )
        ids = [int(t) for t in ids]
        if len(token_logprobs) != len(ids):
            raise PolicyError(
                f"the server returned {len(ids)} token ids but {len(token_logprobs)} log-probs; request "
                "logprobs and start the server with --logprobs-mode processed_logprobs"
            )
        lps: list[float] = []
        for x in token_logprobs:
            if x is None or not math.isfinite(float(x)):
                raise PolicyError(f"the server returned log-prob {x!r} for a sampled token")
            lps.append(min(float(x), 0.0))
        reason = getattr(choice, "finish_reason", None)
        if reason == "length":
            finish = FinishReason.LENGTH
        elif reason == "stop":
            if not ids or (self.stop_token_ids and ids[-1] not in self.stop_token_ids):
                raise PolicyError(
                    "the server says it stopped, but the last token id is not a stop token; the stop "
                    "token must be returned with its log-prob (stop strings are not supported)"
                )
            finish = FinishReason.STOP
        else:
            raise PolicyError(f"unexpected finish_reason {reason!r}")
        if self.tokenizer is not None:
            self._check_text(ids, getattr(choice, "text", None))
        return Generation(tuple(ids), tuple(lps), finish, version)

    def _check_text(self, ids: list[int], text: str | None) -> None:
        if text is None:
            return
        full = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        body = ids[:-1] if ids and ids[-1] in self.stop_token_ids else ids
        short = self.tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if text not in (full, short):
            raise PolicyError(
                f"the server's text {text[:80]!r} does not match its token ids, which decode to "
                f"{full[:80]!r} (engine-side id error, pitfall §15.5)"
            )


def _field(obj: Any, name: str) -> Any:
    v = getattr(obj, name, None)
    if v is None:
        extra = getattr(obj, "model_extra", None) or {}
        v = extra.get(name)
    return v


def _ids_from_tokens(tokens: Sequence[str] | None) -> list[int] | None:
    if not tokens:
        return None
    out = []
    for t in tokens:
        if not isinstance(t, str) or not t.startswith("token_id:"):
            return None
        try:
            out.append(int(t.split(":", 1)[1]))
        except ValueError:
            return None
    return out
