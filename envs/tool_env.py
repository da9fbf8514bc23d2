"""``ToolEnv``: the base class for environments in which the model calls tools.

A subclass says what the task is and how to score the final answer; the base class does the rest::

    class Arithmetic(ToolEnv):
        def __init__(self, **kwargs):
            super().__init__(tools=[calculator], parser="hermes", **kwargs)

        def make_task(self, options):
            a, b = self.rng.randint(10**6, 10**7), self.rng.randint(10**6, 10**7)
            return Task(prompt=f"What is {a} * {b}? End with 'Answer: <n>'.", answer=a * b)

Per episode: ``reset`` builds the prompt (system prompt + the parser's tool instructions, optional worked
example turns, the task) and a fresh tool context. Each ``step`` parses the model's turn with the parser; a
turn with tool calls runs them (:class:`~agentrl.tools.ToolExecutor`) and returns one ``tool`` message per
call, a turn without calls is final and goes to :meth:`ToolEnv.on_final` (default: :meth:`ToolEnv.grade`,
which calls the synchronous :meth:`ToolEnv.score`, then ``terminated``). An env that grades by running code
overrides ``async def grade(self, final, ctx)`` and runs it with ``ctx.run_fresh(code)`` in a fresh sandbox
(from ``sandbox_factory``, default ``LocalSandbox``; never from ``sandbox_pool``, whose slots the episodes
may all hold). The :class:`~agentrl.StepResult` carries the parsed assistant message (with
``tool_calls``) and the tool records. The turn limit is the rollout's (``RolloutConfig.max_turns``), not the
env's: a model that keeps calling tools is stopped there (stop reason ``max_turns``).

Sandbox: when a tool needs one (``needs_sandbox = True``, like the python tool), each episode gets its own
session, opened lazily on the first run (an episode that never runs code costs nothing) from
``sandbox_factory`` (default: ``agentrl.sandbox.LocalSandbox``) or ``sandbox_pool``, and closed or released
on the next ``reset`` and on ``close``. If the sandbox fails, the call is recorded as ``SANDBOX_ERROR`` and
the episode ends (``truncated``); the rollout marks such episodes ``infra_failure`` so they are never scored.

Deadlines, so that no episode waits on a dead sandbox: the session starts before the turn's calls run,
within ``sandbox_start_timeout`` (a pool's queue included), and a start that fails or takes longer is a
``SANDBOX_ERROR`` for every call of the episode, never counted against the model's ``tool_timeout``. Each
call has ``tool_timeout`` (and the sandbox's own wall limit under it); a sandbox killed mid-call answers
``SANDBOX_ERROR`` as soon as its death is seen. The final answer's grading (:meth:`ToolEnv.on_final`) has
``grade_timeout``; past it the episode fails with :class:`~agentrl.errors.SandboxError` (dropped, not scored).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import math
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from agentrl import (
    Action,
    Env,
    ExecResult,
    Limits,
    Message,
    Observation,
    Sandbox,
    SandboxSource,
    ScoreContext,
    StepResult,
    Tool,
    ToolContext,
    ToolRecord,
    ToolStatus,
)
from agentrl.errors import ConfigError, EnvContractError, SandboxError, removed_arguments
from agentrl.tools import ParsedTurn, ToolCallParser, ToolExecutor, get_parser, parse_number
from agentrl.tools import mcp as _mcp

__all__ = ["SandboxFactory", "SandboxSource", "Task", "ToolEnv"]

SandboxFactory = Callable[[], "Sandbox | Awaitable[Sandbox]"]
"""Makes one episode's sandbox (not yet entered; the env enters it on first use and exits it at the end)."""


@dataclass(frozen=True, slots=True)
class Task:
    """One episode's task, made by :meth:`ToolEnv.make_task`."""

    prompt: str | Sequence[Message]
    """The user's question, or the messages that follow the system prompt and worked example."""
    answer: Any = None
    """The reference answer, for :meth:`ToolEnv.score`."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Per-episode resources for the tools (``ToolContext.extra``), e.g. a lookup table."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """Returned as ``reset``'s info (task id, difficulty, ...)."""


@removed_arguments(
    {"max_turns": "the turn limit is the rollout's now: --rollout.max-turns N (RolloutConfig(max_turns=N))"}
)
class ToolEnv(Env):
    """An :class:`~agentrl.Env` whose model calls tools. Subclasses implement :meth:`make_task`.

    Args:
        tools: Tools or documented functions (wrapped with ``@tool``); an ``agentrl.tools.mcp.MCPServer``
            expands into its tools, with a fresh server session per episode (a sandboxed stdio server runs
            in ``agentrl.sandbox.ProcessSandbox`` unless it has a launcher of its own).
        parser: A :class:`~agentrl.tools.ToolCallParser` or its name (``"hermes"``, ``"python"``).
        system_prompt: The system message; the tool instructions replace ``{tools}`` in it, or follow it.
        fewshot: Worked-example messages between the system message and the task.
        tool_timeout: Seconds per tool call (backstop; the python tool's sandbox limit is lower).
        sandbox_start_timeout: Seconds the episode's sandbox may take to start (a pool's queue included);
            longer, or a failed start, answers the episode's sandbox calls with ``SANDBOX_ERROR``.
        grade_timeout: Seconds :meth:`on_final` (grading the final answer) may take; past it the step raises
            :class:`~agentrl.errors.SandboxError`, so the episode is an infrastructure failure, never
            reward 0. ``None``: no deadline.
        max_calls_per_turn: Calls beyond this in one turn are answered with an error, not run.
        sandbox_factory: Makes a sandbox session per episode (default: ``agentrl.sandbox.LocalSandbox``).
        sandbox_pool: Borrow sessions from this pool instead (``agentrl.sandbox.SandboxPool``).
        limits: Resource limits handed to tools (the sandbox clamps them to its own maximum).
        tools_in_prompt: Render the tool instructions into the system prompt (default). ``False`` leaves
            them out and exposes the schemas as ``self.tools`` for a chat template that renders tools itself.
        tool_format: Overrides ``parser`` with a format by name (``"mistral"``, ``"harmony"``, ...: a key of
            ``agentrl.tools.PARSERS``), so a run can pick the format of the model it trains without editing
            the env: ``agentrl train --env_kwargs '{"tool_format": "llama3_json"}'``.
    """

    system_prompt: str = ""
    fewshot: Sequence[Message] = ()

    def __init__(
        self,
        tools: Iterable[Tool | Callable[..., Any] | _mcp.MCPServer],
        *,
        parser: str | ToolCallParser = "hermes",
        system_prompt: str | None = None,
        fewshot: Sequence[Message] | None = None,
        tool_timeout: float | None = 30.0,
        max_calls_per_turn: int = 8,
        sandbox_factory: SandboxFactory | None = None,
        sandbox_pool: SandboxSource | None = None,
        limits: Limits | None = None,
        tools_in_prompt: bool = True,
        tool_format: str | None = None,
        sandbox_start_timeout: float = 60.0,
        grade_timeout: float | None = 120.0,
    ):
        if tool_format is not None:  # a run's choice (--env_kwargs) wins over the subclass's default
            parser = tool_format
        if sandbox_factory is not None and sandbox_pool is not None:
            raise ConfigError("give sandbox_factory or sandbox_pool, not both")
        if not _positive_seconds(sandbox_start_timeout):
            raise ConfigError(
                "sandbox_start_timeout must be a positive finite number of seconds, "
                f"got {sandbox_start_timeout!r}"
            )
        if grade_timeout is not None and not _positive_seconds(grade_timeout):
            raise ConfigError(
                f"grade_timeout must be a positive finite number of seconds or None, got {grade_timeout!r}"
            )
        self.sandbox_start_timeout = float(sandbox_start_timeout)
        self.grade_timeout = None if grade_timeout is None else float(grade_timeout)
        tools, self._mcp = _mcp.expand(tools, _process_sandbox)
        self.executor = ToolExecutor(tools, timeout=tool_timeout, max_calls_per_turn=max_calls_per_turn)
        self.parser = get_parser(parser)
        self.limits = limits
        if system_prompt is not None:
            self.system_prompt = system_prompt
        if fewshot is not None:
            self.fewshot = tuple(fewshot)
        tool_list = self.executor.tool_list()
        instructions = self.parser.format_instructions(tool_list) if tools_in_prompt and tool_list else ""
        if "{tools}" in self.system_prompt:
            self._system = self.system_prompt.replace("{tools}", instructions).strip()
        else:
            self._system = "\n\n".join(p for p in (self.system_prompt.strip(), instructions) if p)
        if not tools_in_prompt:
            self.tools = tuple(self.executor.schemas)  # type: ignore[misc]
        self._needs_sandbox = any(t.needs_sandbox for t in tool_list)
        self._offers_tools = bool(tool_list)
        self._factory = sandbox_factory
        self._pool = sandbox_pool
        self._sandbox: _EpisodeSandbox | None = None
        self.task: Task | None = None
        self.context = ToolContext()
        self.turn = 0
        self.done = True

    @property
    def tool_format(self) -> str | None:
        """The format the env reads calls in (its parser's name) when it offers tools, else None. The
        rollout records it in each trajectory (``meta.extra["tool_format"]``) for the tool-use alarm."""
        return self.parser.name if self._offers_tools else None

    @property
    def needs_sandbox(self) -> bool:
        """Whether a tool runs code in the episode's sandbox (the trainer starts a sandbox pool only then)."""
        return self._needs_sandbox

    # -- what subclasses write ------------------------------------------------------------------------
    @abstractmethod
    def make_task(self, options: dict[str, Any]) -> Task:
        """The task for a new episode; draw randomness from ``self.rng`` only (seeding)."""

    def score(self, parsed: ParsedTurn) -> float:
        """Reward for a final turn. Default: 1.0 when the stated answer equals ``task.answer`` (numbers
        compared exactly, anything else as stripped text), else 0.0."""
        assert self.task is not None
        expected, answer = self.task.answer, parsed.answer
        if answer is None or expected is None:
            return 0.0
        if isinstance(expected, int | float) and not isinstance(expected, bool):
            value = parse_number(answer)
            return float(value is not None and value == expected)
        return float(answer.strip() == str(expected).strip())

    async def grade(self, final: ParsedTurn, ctx: ScoreContext) -> float:
        """Reward for a final turn, asynchronously, with the episode's resources (``ctx``). Default:
        :meth:`score`. Override to run the answer: ``await ctx.run_fresh(code)`` runs code in a fresh
        sandbox (hidden tests belong there, never in ``ctx.sandbox``, the model's own session); a failing
        sandbox raises :class:`~agentrl.errors.SandboxError` and the episode is dropped, not scored 0."""
        return self.score(final)

    def score_context(self) -> ScoreContext:
        """The :class:`~agentrl.ScoreContext` of the running episode."""
        return ScoreContext(
            sandbox=self._sandbox,
            open_sandbox=self._fresh_sandbox,
            extra=self.context.extra,
            episode_id=self.context.episode_id,
        )

    async def on_final(self, parsed: ParsedTurn) -> StepResult:
        """A turn without tool calls. Default: :meth:`grade` it and end the episode. Override for feedback
        turns (return messages and ``terminated=False``); the parsed assistant message is filled in unless
        set."""
        return StepResult(reward=await self.grade(parsed, self.score_context()), terminated=True)

    # -- the Env contract --------------------------------------------------------------------------------
    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Build the task for ``seed`` and return the prompt messages (system, few-shot, task) and its
        info."""
        self.seed(seed)
        await self._release_sandbox()
        for server in self._mcp:  # each episode starts with fresh MCP server sessions
            await server.reset()
        options = dict(options or {})
        self.task = self.make_task(options)
        self.turn, self.done = 0, False
        if self._needs_sandbox:
            self._sandbox = _EpisodeSandbox(self._session, self.sandbox_start_timeout)
        self.context = ToolContext(
            sandbox=self._sandbox,
            limits=self.limits,
            episode_id=str(options.get("episode_id", "")),
            extra=dict(self.task.extra),
        )
        prompt = self.task.prompt
        task_messages = (Message("user", prompt),) if isinstance(prompt, str) else tuple(prompt)
        system = (Message("system", self._system),) if self._system else ()
        return (*system, *self.fewshot, *task_messages), dict(self.task.info)

    async def step(self, action: Action) -> StepResult:
        """Parse the model's turn; run its tool calls (tool messages come back) or score its final answer."""
        if self.task is None or self.done:
            raise EnvContractError(f"{type(self).__name__}.step() called before reset() or after the end")
        turn = self.turn
        self.turn += 1
        parsed = self.parser.parse(action.text, id_prefix=f"call_{turn}")
        assistant = Message("assistant", parsed.content, tool_calls=parsed.calls)
        if not parsed.has_calls:
            final = await self._final_within_deadline(parsed)
            if not isinstance(final, StepResult):
                raise EnvContractError(
                    f"{type(self).__name__}.on_final must return a StepResult, got {final!r:.100}"
                )
            self.done = final.terminated or final.truncated
            if final.assistant_message is None:
                final = dataclasses.replace(final, assistant_message=assistant)
            return final
        if self._mcp:  # start MCP servers outside the calls' time limit (a slow start is not the model's)
            await _mcp.start_sessions(self._mcp, {c.name for c in parsed.calls})
        if self._sandbox is not None and any(
            (t := self.executor.tools.get(c.name)) is not None and t.needs_sandbox for c in parsed.calls
        ):  # start the session outside the calls' time limit (a slow start is not the model's)
            await self._sandbox.open()
        records = await self.executor.run(parsed, self.context, turn=turn)
        result = StepResult(self.tool_messages(records), assistant_message=assistant, tool_calls=records)
        if result.infra_error is not None:  # the rollout ends the episode as sandbox_error
            self.done = True
            return dataclasses.replace(result, observation=(), truncated=True)
        return result

    async def _final_within_deadline(self, parsed: ParsedTurn) -> StepResult:
        """:meth:`on_final` under ``grade_timeout``: a grader stuck on a dead sandbox or judge is an
        infrastructure failure of this episode, not a hang of the whole rollout."""
        if self.grade_timeout is None:
            return await self.on_final(parsed)
        try:
            async with asyncio.timeout(self.grade_timeout) as deadline:
                return await self.on_final(parsed)
        except TimeoutError:
            if not deadline.expired():
                raise  # the grader's own timeout, not ours
            raise SandboxError(
                f"grading did not finish within {self.grade_timeout:g} s (grade_timeout): a grading sandbox "
                "or judge that does not answer; the episode is dropped, not scored"
            ) from None

    def tool_messages(self, records: Sequence[ToolRecord]) -> Observation:
        """One ``tool`` message per record, its content wrapped by the parser."""
        return tuple(
            Message("tool", self.parser.format_output(r.name, r.output), tool_call_id=r.call_id, name=r.name)
            for r in records
        )

    async def close(self) -> None:
        """Give back the episode's sandbox session and end its MCP server sessions."""
        await self._release_sandbox()
        for server in self._mcp:
            await server.close()
        self.done = True

    # -- sandbox sessions --------------------------------------------------------------------------------
    async def check_sandbox(self) -> None:
        """Start one sandbox session the way this env's episodes do and run a line of code in it; raise
        :class:`~agentrl.errors.SandboxError` when it cannot (``agentrl check`` calls this up front, since
        an episode would only record the failure as ``sandbox_error``). Nothing to do when no tool needs
        one."""
        if not self._needs_sandbox:
            return
        async with self._fresh_sandbox() as sandbox:
            r = await sandbox.run("print(6 * 7)")
        if r.status is not ToolStatus.OK or r.stdout != "42\n":
            raise SandboxError(
                f"the sandbox started but could not run print(6 * 7): {r.status.value} {r.message}"
            )

    async def _session(self) -> AbstractAsyncContextManager[Sandbox]:
        """A context manager whose ``__aenter__`` yields this episode's session and whose ``__aexit__``
        ends it: a borrowed pool slot, or a new sandbox (sandboxes are their own context managers)."""
        if self._pool is not None:
            return self._pool.acquire()
        if self._factory is not None:
            made = self._factory()
            return await made if inspect.isawaitable(made) else made
        import agentrl.sandbox as backends  # lazily: tools and envs work without a sandbox backend

        return backends.LocalSandbox(limits=self.limits)

    @asynccontextmanager
    async def _fresh_sandbox(self) -> AsyncIterator[Sandbox]:
        """A new session for grading, outside the pool: episodes holding every pool slot while waiting for
        a grading slot would deadlock."""
        if self._factory is not None:
            made = self._factory()
            cm = await made if inspect.isawaitable(made) else made
        else:
            import agentrl.sandbox as backends

            cm = backends.LocalSandbox(limits=self.limits)
        try:
            sandbox = await cm.__aenter__()
        except BaseException:
            # A start cut short (grade_timeout) may hold processes already: ``async with`` would not exit.
            with contextlib.suppress(Exception):
                await cm.__aexit__(None, None, None)
            raise
        try:
            yield sandbox
        finally:
            await cm.__aexit__(None, None, None)

    async def _release_sandbox(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await sandbox.close()


def _positive_seconds(value: object) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and value > 0 and math.isfinite(value)
    )


def _process_sandbox() -> _mcp.ProcessLauncher:
    """The default launcher of sandboxed stdio MCP servers (imported lazily, like the sandbox backends)."""
    from agentrl.sandbox.process import ProcessSandbox

    return ProcessSandbox()


class _EpisodeSandbox:
    """One episode's sandbox session, opened on first use within ``start_timeout`` seconds. A failure to
    open is remembered and reported as every run's ``SANDBOX_ERROR`` result rather than raised, like any
    other sandbox failure."""

    def __init__(
        self,
        session: Callable[[], Awaitable[AbstractAsyncContextManager[Sandbox]]],
        start_timeout: float = 60.0,
    ):
        self._session = session
        self._start_timeout = start_timeout
        self._cm: AbstractAsyncContextManager[Sandbox] | None = None
        self._inner: Sandbox | None = None
        self._closed = False
        self._start_error = ""

    async def open(self) -> None:
        """Start the session now unless it is running, closed or already failed to start."""
        if self._inner is not None or self._closed or self._start_error:
            return
        cm: AbstractAsyncContextManager[Sandbox] | None = None
        try:
            async with asyncio.timeout(self._start_timeout):
                cm = await self._session()
                self._inner = await cm.__aenter__()
            self._cm = cm
        except Exception as e:
            if isinstance(e, TimeoutError):
                why = f"it did not start within {self._start_timeout:g} s (sandbox_start_timeout)"
            else:
                why = repr(e)
            self._start_error = f"could not start the sandbox: {why}"
            if cm is not None:  # release what a half-made start holds (processes, a pool slot)
                with contextlib.suppress(Exception):
                    await cm.__aexit__(None, None, None)

    async def run(self, code: str, *, timeout: float | None = None) -> ExecResult:
        if self._closed:
            return ExecResult(ToolStatus.SANDBOX_ERROR, message="the episode's sandbox is closed")
        await self.open()
        if self._inner is None:
            return ExecResult(ToolStatus.SANDBOX_ERROR, message=self._start_error or "no sandbox")
        return await self._inner.run(code, timeout=timeout)

    async def reset(self) -> None:
        if self._inner is not None:
            await self._inner.reset()

    async def close(self) -> None:
        self._closed = True
        cm, self._cm, self._inner = self._cm, None, None
        if cm is not None:
            await cm.__aexit__(None, None, None)

    async def __aenter__(self) -> _EpisodeSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
