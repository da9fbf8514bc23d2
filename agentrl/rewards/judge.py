"""Model judges: a prompt template, a backend that answers it, and an output parser; cached, retried, bounded.

A :class:`Judge` renders its template with a sample's fields (``{question}``, ``{answer}``, ``{reference}``,
``{criterion}``, whatever the caller passes), sends it to a :class:`JudgeBackend` and parses the answer into
a score in [0, 1] with its output parser (:func:`parse_score`: ``Score: 7/10``; :func:`parse_pass_fail`:
``PASS``/``FAIL``). Backends: :class:`OpenAIJudgeBackend` (any OpenAI-compatible ``/chat/completions``
endpoint: vLLM, the agentrl gateway, a hosted API) and :class:`PolicyJudgeBackend` (a model served in this
process through the :class:`~agentrl.protocols.Policy` seam, no HTTP).

Every call is bounded: at most ``concurrency`` requests in flight per judge (:meth:`Judge.judge_many` sends
a batch concurrently under that limit), each request under ``request_timeout_s``, retried (5xx, 429,
connection errors, timeouts, an answer the parser cannot read) with backoff until ``retries`` or the
``deadline_s`` of the call runs out. Then it raises :class:`~agentrl.errors.JudgeError`: an infrastructure
failure, so the episode is dropped (stop reason ``judge_error``), never rewarded 0. A 4xx other than 429 is a
configuration error (a wrong model name, a bad key) and fails at once.

Calls are cached by the hash of their input (judge identity, system prompt, prompt, sampling settings,
parser): the raw answer is kept and a repeated input is answered from the :class:`JudgeCache` (in memory,
and in a JSONL file when given one, so a re-run of the same episodes makes no judge calls). Every call
returns a :class:`~agentrl.reward_records.JudgeCall` (prompt, raw answer, parsed score, latency,
attempts, cached) that the env records with the trajectory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import httpx

from agentrl.chat import ChatRenderer
from agentrl.errors import ConfigError, JudgeError
from agentrl.protocols import Policy, Sampling
from agentrl.reward_records import JudgeCall
from agentrl.types import Message

__all__ = [
    "OUTPUT_PARSERS",
    "Answer",
    "Judge",
    "JudgeBackend",
    "JudgeCache",
    "JudgeUnavailable",
    "OpenAIJudgeBackend",
    "PolicyJudgeBackend",
    "parse_pass_fail",
    "parse_score",
]


class JudgeUnavailable(Exception):
    """One request failed in a way worth retrying (5xx, 429, connection, timeout)."""


@runtime_checkable
class JudgeBackend(Protocol):
    """Answers one judge prompt with text."""

    @property
    def name(self) -> str:
        """Who answers (``model@base_url``): part of the cache key and of every :class:`JudgeCall`."""
        ...

    async def complete(
        self, system: str, prompt: str, *, max_tokens: int, temperature: float, timeout: float
    ) -> str:
        """The model's answer to ``prompt`` (after ``system``).

        Raises:
            JudgeUnavailable: a failure worth retrying.
            JudgeError: a failure retrying cannot fix (a 4xx: wrong model name, bad key).
        """
        ...


class OpenAIJudgeBackend:
    """A judge behind any OpenAI-compatible ``POST {base_url}/chat/completions``.

    Args:
        base_url: The API root, ending in ``/v1`` (``http://127.0.0.1:8000/v1``). A ``{uid}`` in it is
            replaced by a fresh id per request, for servers that hold one conversation per URL, such as the
            agentrl gateway (``http://127.0.0.1:8000/s/judge-{uid}/v1``: one session per judge call).
        model: The model name sent in each request.
        api_key: Sent as ``Authorization: Bearer``; ``None`` sends none.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None):
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"judge base_url must be an http(s) URL, got {base_url!r}")
        if not model:
            raise ConfigError("judge model must be named")
        self.base_url, self.model, self.api_key = base_url.rstrip("/"), model, api_key

    @property
    def name(self) -> str:
        """``model@base_url``."""
        return f"{self.model}@{self.base_url}"

    async def complete(
        self, system: str, prompt: str, *, max_tokens: int, temperature: float, timeout: float
    ) -> str:
        """One chat completion; the first choice's content."""
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        # One client per request: a judge is shared by episodes that may run on different event loops.
        try:
            async with httpx.AsyncClient(timeout=timeout) as client:
                url = self.base_url.replace("{uid}", uuid.uuid4().hex)
                resp = await client.post(f"{url}/chat/completions", json=body, headers=headers)
        except (httpx.TimeoutException, httpx.TransportError) as e:
            raise JudgeUnavailable(f"{type(e).__name__}: {e}") from e
        if resp.status_code >= 500 or resp.status_code == 429:
            raise JudgeUnavailable(f"HTTP {resp.status_code}: {resp.text[:200]}")
        if resp.status_code >= 400:
            raise JudgeError(
                f"judge {self.name} refused the request: HTTP {resp.status_code}: {resp.text[:300]}"
            )
        try:
            return str(resp.json()["choices"][0]["message"]["content"] or "")
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise JudgeUnavailable(f"malformed response: {resp.text[:200]}") from e


class PolicyJudgeBackend:
    """A judge served in this process: a :class:`~agentrl.protocols.Policy` and its chat renderer.

    Args:
        policy: Samples the verdict (``HFPolicy`` over any local model).
        renderer: Renders the judge's messages with the model's chat template.
        name: The judge's name in records and cache keys (``<model>@local``).
    """

    def __init__(self, policy: Policy, renderer: ChatRenderer, *, name: str):
        self.policy, self.renderer, self._name = policy, renderer, name

    @property
    def name(self) -> str:
        """The name given."""
        return self._name

    async def complete(
        self, system: str, prompt: str, *, max_tokens: int, temperature: float, timeout: float
    ) -> str:
        """Render, generate (greedy at temperature 0 is the policy's business), decode."""
        messages = ([Message("system", system)] if system else []) + [Message("user", prompt)]
        ids = self.renderer.render_prompt(messages).token_ids
        sampling = Sampling(max_new_tokens=max_tokens, temperature=max(temperature, 1e-5))
        try:
            gen = await asyncio.wait_for(self.policy.generate(ids, sampling), timeout)
        except TimeoutError as e:
            raise JudgeUnavailable(f"generation took over {timeout:g} s") from e
        except Exception as e:
            raise JudgeUnavailable(f"{type(e).__name__}: {e}") from e
        return self.renderer.assistant_text(gen.token_ids)


_SCORE = re.compile(r"score\s*[:=]?\s*\**\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?", re.IGNORECASE)
_LEAD_NUMBER = re.compile(r"^\W*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?")


def parse_score(raw: str, max_score: float = 10.0) -> float:
    """Read ``Score: 7`` / ``score = 7/10`` (the last such), else a number the answer starts with, as a
    score in [0, 1] (divided by ``max_score`` or by the ``/N`` written).

    Raises:
        ValueError: no score, or one outside ``[0, max_score]``.
    """
    found = _SCORE.findall(raw)
    m = found[-1] if found else None
    if m is None:
        lead = _LEAD_NUMBER.match(raw)
        m = lead.groups() if lead else None
    if m is None:
        raise ValueError(f"no score in the judge's answer {raw[:120]!r}")
    value, out_of = float(m[0]), float(m[1]) if m[1] else max_score
    if out_of <= 0 or not 0 <= value <= out_of:
        raise ValueError(f"score {m[0]} is outside [0, {out_of:g}] in {raw[:120]!r}")
    return value / out_of


_VERDICT = re.compile(r"\b(pass|fail|yes|no|correct|incorrect)\b", re.IGNORECASE)


def parse_pass_fail(raw: str) -> float:
    """1.0 for ``PASS``/``YES``/``CORRECT``, 0.0 for ``FAIL``/``NO``/``INCORRECT`` (the last such word).

    Raises:
        ValueError: no verdict word.
    """
    found = _VERDICT.findall(raw)
    if not found:
        raise ValueError(f"no PASS/FAIL verdict in the judge's answer {raw[:120]!r}")
    return 1.0 if found[-1].lower() in ("pass", "yes", "correct") else 0.0


OUTPUT_PARSERS: dict[str, Callable[[str], float]] = {"score": parse_score, "pass_fail": parse_pass_fail}
"""The output parsers by name (``--reward.parser``)."""


class JudgeCache:
    """Judge answers by input hash, in memory and (given ``path``) in an append-only JSONL file.

    Args:
        path: A file to load answers from and append new ones to; ``None`` keeps them in memory only.
    """

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._entries: dict[str, str] = {}
        if self.path is not None and self.path.exists():
            for n, line in enumerate(self.path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    self._entries[str(d["key"])] = str(d["raw"])
                except (ValueError, KeyError, TypeError) as e:
                    raise ConfigError(f"{self.path}:{n}: not a judge cache line: {e}") from e

    def get(self, key: str) -> str | None:
        """The cached raw answer for ``key``, if any."""
        with self._lock:
            return self._entries.get(key)

    def put(self, key: str, raw: str) -> None:
        """Remember an answer (and append it to the file)."""
        with self._lock:
            self._entries[key] = raw
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as f:
                    f.write(json.dumps({"key": key, "raw": raw}) + "\n")

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Answer(Generic[T]):
    """A judge's answer to one prompt, read by a parser."""

    raw: str
    """The answer, verbatim."""
    parsed: T
    """What the parser read from it."""
    latency_s: float
    """Seconds it took, all attempts (0 from the cache)."""
    key: str
    """The prompt's cache key."""
    cached: bool
    """It came from the cache."""
    attempts: int
    """Requests it took (0 from the cache)."""


@dataclass(frozen=True, slots=True)
class _Settings:
    max_tokens: int
    temperature: float
    concurrency: int
    retries: int
    deadline_s: float
    request_timeout_s: float


class Judge:
    """A prompt template judged by a backend, parsed into a score in [0, 1].

    Args:
        backend: Who answers (:class:`OpenAIJudgeBackend`, :class:`PolicyJudgeBackend`, or your own).
        template: The prompt, a ``str.format`` template over the sample's fields.
        parser: ``"score"``, ``"pass_fail"`` or a function ``raw -> score in [0, 1]`` that raises
            ``ValueError`` on an answer it cannot read.
        parser_name: The parser's name in cache keys (required for a function parser).
        system: A system prompt (may be empty).
        max_tokens: Most tokens the judge may write.
        temperature: Its sampling temperature (0: as deterministic as the backend allows).
        concurrency: Most requests in flight at once from this judge.
        retries: Extra attempts after a failed or unreadable answer.
        deadline_s: Seconds one call may take, all attempts together; then :class:`JudgeError`.
        request_timeout_s: Seconds one request may take.
        cache: Answers by input hash (default: a fresh in-memory cache).
    """

    def __init__(
        self,
        backend: JudgeBackend,
        template: str,
        *,
        parser: str | Callable[[str], float] = "score",
        parser_name: str | None = None,
        system: str = "",
        max_tokens: int = 64,
        temperature: float = 0.0,
        concurrency: int = 8,
        retries: int = 2,
        deadline_s: float = 60.0,
        request_timeout_s: float = 30.0,
        cache: JudgeCache | None = None,
    ):
        if isinstance(parser, str):
            if parser not in OUTPUT_PARSERS:
                raise ConfigError(f"unknown judge parser {parser!r}; choose from {sorted(OUTPUT_PARSERS)}")
            parser_name, parser = parser, OUTPUT_PARSERS[parser]
        elif not parser_name:
            raise ConfigError("a function parser needs a parser_name (it is part of the cache key)")
        if concurrency < 1 or retries < 0 or deadline_s <= 0 or request_timeout_s <= 0 or max_tokens < 1:
            raise ConfigError(
                f"judge limits must be positive: concurrency={concurrency}, retries={retries}, "
                f"deadline_s={deadline_s}, request_timeout_s={request_timeout_s}, max_tokens={max_tokens}"
            )
        self.backend, self.template, self.system = backend, template, system
        self.parser, self.parser_name = parser, parser_name
        self.settings = _Settings(
            max_tokens, temperature, concurrency, retries, deadline_s, request_timeout_s
        )
        self.cache = cache if cache is not None else JudgeCache()
        self.requests = 0
        """Requests actually sent (a cached answer sends none): what tests and logs count."""
        self._limits: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def name(self) -> str:
        """The backend's name."""
        return self.backend.name

    def with_backend(self, backend: JudgeBackend, cache: JudgeCache | None = None) -> Judge:
        """The same judge (template, parser, limits) asked of another backend (``replay --rescore``)."""
        return self.replace(backend=backend, cache=cache)

    def replace(self, **changes: Any) -> Judge:
        """A judge like this one with some constructor arguments changed (``template``, ``max_tokens``,
        ``backend``, ``cache``, ...); unchanged, it shares this judge's cache."""
        s = self.settings
        args: dict[str, Any] = {
            "backend": self.backend,
            "template": self.template,
            "parser": self.parser,
            "parser_name": self.parser_name,
            "system": self.system,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "concurrency": s.concurrency,
            "retries": s.retries,
            "deadline_s": s.deadline_s,
            "request_timeout_s": s.request_timeout_s,
            "cache": self.cache,
        }
        return Judge(**(args | changes))

    def render(self, fields: Mapping[str, Any]) -> str:
        """The prompt for ``fields``.

        Raises:
            ConfigError: the template names a field that was not given.
        """
        try:
            return self.template.format(**fields)
        except (KeyError, IndexError) as e:
            raise ConfigError(f"judge template needs field {e} (given: {sorted(fields)})") from e

    def key(self, prompt: str) -> str:
        """The cache key of ``prompt`` for this judge (judge, system, prompt, sampling, parser)."""
        s = self.settings
        blob = json.dumps([self.name, self.system, prompt, s.max_tokens, s.temperature, self.parser_name])
        return hashlib.sha256(blob.encode()).hexdigest()

    async def judge(self, fields: Mapping[str, Any]) -> JudgeCall:
        """Judge one sample (its fields fill the template)."""
        return await self.ask(self.render(fields))

    async def judge_many(self, samples: Sequence[Mapping[str, Any]]) -> list[JudgeCall]:
        """Judge a batch concurrently (at most ``concurrency`` requests in flight); results in order."""
        return list(await asyncio.gather(*(self.judge(f) for f in samples)))

    async def ask(self, prompt: str) -> JudgeCall:
        """Judge a rendered prompt: from the cache, else with retries until the deadline.

        Raises:
            JudgeError: no readable answer within the retries and the deadline (an infrastructure failure).
        """
        a = await self.answer(prompt, self._checked)
        return JudgeCall(self.name, prompt, a.raw, a.parsed, a.latency_s, a.key, a.cached, a.attempts)

    def _checked(self, raw: str) -> float:
        score = float(self.parser(raw))
        if not 0.0 <= score <= 1.0:
            raise ConfigError(f"judge parser {self.parser_name!r} returned {score!r}, not in [0, 1]")
        return score

    async def answer(self, prompt: str, parse: Callable[[str], T]) -> Answer[T]:
        """The judge's answer to ``prompt`` read by ``parse`` (which raises ``ValueError`` when it cannot
        read it): from the cache (the raw answer is cached and parsed again), else asked with retries until
        the deadline. :meth:`ask` is this with the judge's own parser; a group judge passes its own.

        Raises:
            JudgeError: no readable answer within the retries and the deadline (an infrastructure failure).
        """
        key = self.key(prompt)
        hit = self.cache.get(key)
        if hit is not None:
            try:
                return Answer(hit, parse(hit), 0.0, key, True, 0)
            except ValueError:
                pass  # a cache written by another parser: ask again
        s = self.settings
        t0 = time.perf_counter()
        errors: list[str] = []
        async with self._limit():
            for attempt in range(1, s.retries + 2):
                left = s.deadline_s - (time.perf_counter() - t0)
                if left <= 0:
                    break
                self.requests += 1
                try:
                    raw = await self.backend.complete(
                        self.system,
                        prompt,
                        max_tokens=s.max_tokens,
                        temperature=s.temperature,
                        timeout=min(s.request_timeout_s, left),
                    )
                    parsed = parse(raw)
                except (JudgeUnavailable, ValueError) as e:  # down, or an answer it cannot read: ask again
                    errors.append(str(e))
                else:
                    self.cache.put(key, raw)
                    return Answer(raw, parsed, time.perf_counter() - t0, key, False, attempt)
                backoff = min(0.25 * 2 ** (attempt - 1), s.deadline_s - (time.perf_counter() - t0))
                if backoff > 0 and attempt <= s.retries:
                    await asyncio.sleep(backoff)
        raise JudgeError(
            f"judge {self.name} gave no readable answer in {len(errors)} attempt(s) over "
            f"{time.perf_counter() - t0:.1f} s; last: {errors[-1] if errors else 'deadline passed'}"
        )

    def _limit(self) -> asyncio.Semaphore:
        """This event loop's semaphore (a judge may be shared by episodes on several loops)."""
        loop = asyncio.get_running_loop()
        sem = self._limits.get(loop)
        if sem is None:
            sem = self._limits[loop] = asyncio.Semaphore(self.settings.concurrency)
        return sem
