"""``bfcl-multi-turn-v0``: the Berkeley Function Calling Leaderboard's multi-turn tasks, graded by BFCL.

One episode is one BFCL task (``bfcl-eval`` on PyPI, BFCL v4): fresh instances of its backends (file system,
math, messaging, posting, ticketing, trading bot, travel booking, vehicle control) loaded with the task's
initial state, and its user turns. The model calls the backends' functions (tools built from BFCL's function
docs); a turn without a call ends the user turn, as BFCL's runner ends it, and BFCL's checker judges it
(the state of every backend against the ground truth's, then the model's results against the ground
truth's). The next user question follows, or the episode ends: reward 1 when every turn passed, else 0
at the first failing turn. ``miss_func`` tasks reveal their held-out functions at BFCL's turn (callable
from then on), ``miss_param`` tasks have turns whose ground truth is no call, ``long_context`` loads the
backends with BFCL's long-context extensions. More than BFCL's step limit of calling turns within one
user turn fails the task, as BFCL force-quits it.

The model's calls are data: parsed by the env's tool-call format, checked against the function's schema
and run as a bound method of the episode's own backend instance with keyword arguments; nothing the model
writes reaches ``eval`` (see :mod:`agentrl.envs.bfcl_data`).

Arguments (``--env-kwargs``): ``category`` (``base``, ``miss_func``, ``miss_param``, ``long_context``, or
BFCL's full names), ``split`` (``train``, ``test``: a fixed fifth of the tasks by a hash of their id, or
``all``), ``tool_format`` (one of the six model-family formats). Task ``seed`` is the task's index in the
split (modulo its size), so ``agentrl eval --tasks N`` with N the split's size covers it once.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl import Message, Observation, StepResult, ToolContext
from agentrl.envs.tool_env import Task, ToolEnv
from agentrl.errors import ConfigError
from agentrl.protocols import ToolOutput
from agentrl.tools import ParsedTurn, ToolExecutor
from agentrl.types import Action, ToolCall, ToolRecord, ToolStatus

from . import bfcl_data as data

__all__ = ["FORMATS", "BFCLMultiTurnEnv", "BFCLTool", "render_calls"]

FORMATS = ("hermes", "llama3_json", "mistral", "qwen3_coder", "deepseek_v3", "harmony")
"""The tool-call formats the env accepts (``qwen`` is ``hermes``); ``python`` blocks call no BFCL function."""

SYSTEM_PROMPT = (
    "You are an assistant that acts by calling functions. The user gives you one request per turn. Call "
    "the functions you need, one or several at a time, and read their results. When the request is done, "
    "or when it cannot be done with the functions you have or the information you were given, answer in "
    "plain text without a function call: that ends your turn and the user's next request follows."
)


class BFCLTool:
    """One BFCL function of one episode, as an agentrl :class:`~agentrl.protocols.Tool`."""

    needs_sandbox = False
    """The backends are plain Python objects of this process; the model's text is never run as code."""

    def __init__(self, spec: data.FunctionSpec, episode: _Episode):
        self._spec = spec
        self._episode = episode

    @property
    def name(self) -> str:
        """The function's name in BFCL's docs."""
        return self._spec.name

    @property
    def schema(self) -> dict[str, Any]:
        """BFCL's function doc as an OpenAI function schema."""
        return dict(self._spec.schema)

    def __repr__(self) -> str:
        return f"BFCLTool({self.name!r}, {self._spec.class_name})"

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Run the call on the episode's backend and record its result for BFCL's response check."""
        ran, result = self._episode.backends.call(self.name, arguments)
        self._episode.results.append(result)
        if not ran:
            return ToolOutput(result, ToolStatus.BAD_ARGUMENTS)
        return ToolOutput(
            result, ToolStatus.ERROR if result.startswith("Error during execution") else ToolStatus.OK
        )


@dataclasses.dataclass(slots=True)
class _Episode:
    """What one episode holds: its task, backends, BFCL's checker and the current user turn's record."""

    task: data.BFCLTask
    backends: data.Backends
    checker: data.GroundTruthChecker
    turn: int = 0
    results: list[str] = dataclasses.field(default_factory=list)
    called: bool = False
    steps: int = 0


class BFCLMultiTurnEnv(ToolEnv):
    """BFCL v4 multi-turn function calling: BFCL's tasks, backends and checker (agentrl[bfcl]).

    Args:
        category: ``base``, ``miss_func``, ``miss_param`` or ``long_context`` (or ``multi_turn_*``).
        split: ``train`` (four fifths of the tasks), ``test`` (the held-out fifth) or ``all``.
        parser: The tool-call format (one of :data:`FORMATS`); ``tool_format`` overrides it.
        max_steps_per_turn: Calling turns allowed within one user turn before the task fails (BFCL's
            ``MAXIMUM_STEP_LIMIT`` when ``None``).
        **kwargs: Passed to :class:`~agentrl.envs.ToolEnv` (``tool_format``, ``tool_timeout``, ...).
    """

    system_prompt = SYSTEM_PROMPT

    def __init__(
        self,
        category: str = "base",
        split: str = "train",
        *,
        parser: str = "hermes",
        max_steps_per_turn: int | None = None,
        **kwargs: Any,
    ):
        data.bfcl()  # the install command, before anything else can fail on a missing wheel
        fmt = kwargs.get("tool_format") or parser
        fmt = "hermes" if fmt == "qwen" else fmt
        if fmt not in FORMATS:
            raise ConfigError(f"bfcl-multi-turn-v0 takes a tool_format among {list(FORMATS)}, got {fmt!r}")
        if kwargs.get("tools_in_prompt", True) is not True:
            raise ConfigError("bfcl-multi-turn-v0 renders its tools into the prompt (tools_in_prompt=True)")
        if split not in ("train", "test", "all"):
            raise ConfigError(f"split must be 'train', 'test' or 'all', got {split!r}")
        self.category = data.category_name(category)
        self.split = split
        tasks = data.load_tasks(self.category)
        self.tasks = tuple(t for t in tasks if split == "all" or data.split_of(t.id) == split)
        if max_steps_per_turn is None:
            limit: int = data.submodule("constants.default_prompts").MAXIMUM_STEP_LIMIT
            max_steps_per_turn = limit
        if max_steps_per_turn < 1:
            raise ConfigError(f"max_steps_per_turn must be >= 1, got {max_steps_per_turn}")
        self.max_steps_per_turn = max_steps_per_turn
        kwargs.pop("tool_format", None)
        super().__init__([], parser=fmt, **kwargs)
        self.format = fmt
        self._executor_args = {
            "timeout": self.executor.timeout,
            "max_calls_per_turn": self.executor.max_calls_per_turn,
            "max_output_chars": self.executor.max_output_chars,
        }
        self._episode: _Episode | None = None
        self._seed: int | None = None

    # -- episodes --------------------------------------------------------------------------------------
    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start the task of ``seed`` (its index in the split) or of ``options["task_id"]``."""
        self._end_episode()
        self._seed = seed
        return await super().reset(seed=seed, options=options)

    def make_task(self, options: dict[str, Any]) -> Task:
        """Load the task's backends, build its visible tools and the first turn's messages."""
        task = self._pick(options)
        episode = _Episode(task, data.Backends(task), data.GroundTruthChecker(task))
        self._episode = episode
        hidden = {name for names in task.missed_function.values() for name in names}
        tools = [BFCLTool(s, episode) for s in episode.backends.specs.values()]
        self.executor = _Executor(tools, hidden=hidden, **self._executor_args)
        if hidden:  # qwen3_coder types argument values by the schemas it was shown: show it all of them once
            self.parser.format_instructions(tools)
        instructions = self.parser.format_instructions([t for t in tools if t.name not in hidden])
        self._system = f"{self.system_prompt}\n\n{instructions}"
        info = {"task_id": task.id, "category": task.category, "turns": len(task.questions)}
        return Task(prompt=_user_messages(task.questions[0]), info=info)

    def _pick(self, options: Mapping[str, Any]) -> data.BFCLTask:
        wanted = options.get("task_id")
        if wanted is not None:
            for t in data.load_tasks(self.category):
                if t.id == wanted:
                    return t
            raise ConfigError(f"no BFCL task {wanted!r} in {self.category}")
        if not self.tasks:
            raise ConfigError(f"the {self.split} split of {self.category} is empty")
        index = self._seed if self._seed is not None else self.rng.randrange(len(self.tasks))
        return self.tasks[index % len(self.tasks)]

    async def step(self, action: Action) -> StepResult:
        """A turn with calls runs them on the episode's backends; a turn without ends the user turn."""
        result = await super().step(action)
        episode = self._episode
        if episode is None or not result.tool_calls or self.done:
            return result
        episode.called = episode.called or any(
            r.status is not ToolStatus.PARSE_ERROR for r in result.tool_calls
        )
        episode.steps += 1
        if episode.steps > self.max_steps_per_turn:  # BFCL force-quits such a turn and fails the task
            self.done = True
            info = self._info("multi_turn:force_terminated", f"more than {self.max_steps_per_turn} steps")
            self._end_episode()
            return dataclasses.replace(result, observation=(), terminated=True, info=info)
        return result

    async def on_final(self, parsed: ParsedTurn) -> StepResult:
        """BFCL's check of the user turn that just ended; then the next question, or the reward."""
        episode = self._episode
        assert episode is not None
        verdict = episode.checker.check_turn(episode.turn, episode.backends, episode.results, episode.called)
        if not verdict["valid"]:
            info = self._info(str(verdict.get("error_type", "")), str(verdict.get("error_message", "")))
            self._end_episode()
            return StepResult(reward=0.0, terminated=True, info=info)
        episode.turn += 1
        episode.results, episode.called, episode.steps = [], False, 0
        task = episode.task
        if episode.turn == len(task.questions):
            info = self._info("", "")
            self._end_episode()
            return StepResult(reward=1.0, terminated=True, info=info)
        messages = _user_messages(task.questions[episode.turn])
        revealed = task.missed_function.get(episode.turn, ())
        if revealed:
            new = [self.executor.tools[n] for n in revealed if n in self.executor.tools]
            if isinstance(self.executor, _Executor):
                self.executor.hidden -= set(revealed)
            prompts = data.submodule("constants.default_prompts")
            sentence: str = prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
            text = f"{self.parser.format_instructions(new)}\n\n{sentence}"
            messages = (*messages, Message("user", text))
        return StepResult(observation=messages, terminated=False, info=self._info("", ""))

    def _info(self, error_type: str, error_message: str) -> dict[str, Any]:
        episode = self._episode
        assert episode is not None
        info: dict[str, Any] = {
            "task_id": episode.task.id,
            "category": episode.task.category,
            "turn": episode.turn,
        }
        if error_type:
            info["error_type"] = error_type
            info["error_message"] = error_message[:500]
        return info

    def _end_episode(self) -> None:
        if self._episode is not None:
            self._episode.checker.close()

    async def close(self) -> None:
        """Release the episode's ground-truth instances (and what :class:`ToolEnv` holds)."""
        self._end_episode()
        await super().close()

    # -- the ground truth as a sample episode ------------------------------------------------------------
    def sample_actions(self) -> Sequence[str]:
        """The task's ground truth from the current turn on (a turn's calls together, at most the executor's
        calls per turn at a time), each user turn ended by a plain answer: BFCL's checker accepts it
        (``agentrl check`` plays it)."""
        episode = self._episode
        if episode is None:
            return ()
        task = episode.task
        actions: list[str] = []
        for turn in range(episode.turn, len(task.questions)):
            calls = [data.parse_call_string(c, task.involved_classes) for c in task.ground_truth[turn]]
            size = self.executor.max_calls_per_turn  # several calls per model turn, as BFCL's runs have them
            for k in range(0, len(calls), size):
                actions.append(
                    render_calls(self.format, [(c.name, c.arguments) for c in calls[k : k + size]])
                )
            actions.append("Done.")
        return tuple(actions)


class _Executor(ToolExecutor):
    """The episode's executor: a ``miss_func`` task's held-out functions stay callable before their turn
    (BFCL's executor knows every method of the involved classes, and one ground truth calls a held-out
    function early), but an unknown-tool answer lists only the functions the model has been shown."""

    def __init__(self, tools: Sequence[BFCLTool], *, hidden: set[str], **kwargs: Any):
        super().__init__(tools, **kwargs)
        self.hidden = hidden

    async def call(self, call: ToolCall, context: ToolContext, *, turn: int) -> ToolRecord:
        """Run one call; an unknown name is answered with the shown functions only."""
        if call.name in self.tools:
            return await super().call(call, context, turn=turn)
        shown = ", ".join(sorted(n for n in self.tools if n not in self.hidden))
        return ToolRecord(
            call_id=call.id,
            name=call.name,
            arguments=call.arguments,
            output=f"Unknown tool {call.name[:100]!r}. Available tools: {shown}.",
            status=ToolStatus.UNKNOWN_TOOL,
            duration_s=0.0,
            turn=turn,
        )


def _user_messages(turn: Sequence[Mapping[str, str]]) -> Observation:
    return tuple(Message(str(m.get("role", "user")), str(m["content"])) for m in turn)


def render_calls(fmt: str, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Calls written in a tool-call format as a model of that family writes them, several in one turn
    (for sample episodes and tests). ``qwen3_coder`` writes string values raw, as Qwen3-Coder does."""
    if fmt not in FORMATS:
        raise ConfigError(f"no call renderer for the tool format {fmt!r}; known: {list(FORMATS)}")
    objects = [(json.dumps(name), json.dumps(dict(args))) for name, args in calls]
    if fmt == "hermes":
        return "\n".join(f'<tool_call>\n{{"name": {n}, "arguments": {a}}}\n</tool_call>' for n, a in objects)
    if fmt == "llama3_json":
        return "; ".join(f'{{"name": {n}, "parameters": {a}}}' for n, a in objects)
    if fmt == "mistral":
        return "[TOOL_CALLS][" + ", ".join(f'{{"name": {n}, "arguments": {a}}}' for n, a in objects) + "]"
    if fmt == "deepseek_v3":
        blocks = "".join(
            f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{json.dumps(dict(args))}<｜tool▁call▁end｜>"
            for name, args in calls
        )
        return f"<｜tool▁calls▁begin｜>{blocks}<｜tool▁calls▁end｜>"
    if fmt == "harmony":
        return "".join(
            f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
            f"{json.dumps(dict(args))}<|call|>"
            for name, args in calls
        )
    out = []
    for name, args in calls:  # qwen3_coder
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
            for k, v in args.items()
        )
        out.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
    return "\n".join(out)
