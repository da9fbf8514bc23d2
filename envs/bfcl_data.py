"""BFCL's multi-turn tasks, backends and checker, read from the ``bfcl-eval`` wheel, never evaluated as code.

What comes from BFCL (``bfcl_eval``, BFCL v4) and is used as it is: the task files and their ground truth
(``bfcl_eval/data``), the function docs of each backend (``data/multi_turn_func_doc``), the executable
backend classes (``eval_checker/multi_turn_eval/func_source_code``) with their ``_load_scenario``, the
checker's ``state_checker`` and ``response_checker``, and its executor for the *ground-truth* side (BFCL's
own call strings, its data).

What is ours: the model's side. BFCL's runner turns the model's output into call strings and evaluates
them; here a call arrives parsed (a name and JSON arguments), its name must be a public method of one of
the task's backends that the task's function docs list (an allow-list), its arguments are checked against
that doc's schema, and the bound method is called with them as keyword data (:class:`Backends`). The result is
written as BFCL writes it (a string, a dict as JSON, anything else through ``str``; an exception as
``Error during execution: ...``) so that BFCL's response check compares like with like.

Only the light corner of the wheel is imported: its heavy requirements (API clients, sentence-transformers,
faiss, a numpy 1.26 pin) belong to parts of BFCL this module never touches, so the wheel is installed with
``--no-deps`` next to ``agentrl[bfcl]`` (``mpmath`` for the math backend, ``jsonschema`` for the checks).
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import importlib
import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any
from uuid import uuid4

from agentrl.errors import ConfigError

__all__ = [
    "BFCL_VERSION",
    "CATEGORIES",
    "INSTALL",
    "BFCLTask",
    "Backends",
    "FunctionSpec",
    "GroundTruthChecker",
    "ParsedCall",
    "bfcl",
    "category_name",
    "format_result",
    "function_specs",
    "load_tasks",
    "parse_call_string",
    "split_of",
    "submodule",
]

BFCL_VERSION = "2026.3.23"
"""The ``bfcl-eval`` release this env was checked against (its ground-truth sweep is in the tests)."""
INSTALL = f"pip install 'agentrl[bfcl]' && pip install --no-deps 'bfcl-eval=={BFCL_VERSION}'"
"""How to install what the env needs (the wheel without its 71 requirements, which it does not use here)."""
CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
"""BFCL's four multi-turn categories, as the leaderboard names them."""
_TEST_SHARE = 5
"""One task in five (by a hash of its id) is held out as the test split."""


def bfcl() -> ModuleType:
    """The ``bfcl_eval`` package, or a :class:`ConfigError` naming the install command."""
    try:
        return importlib.import_module("bfcl_eval")
    except ModuleNotFoundError as e:
        if e.name not in ("bfcl_eval", None):
            raise ConfigError(
                f"bfcl-eval is installed but needs {e.name!r} for its multi-turn backends: {INSTALL}"
            ) from e
        raise ConfigError(
            f"bfcl-multi-turn-v0 needs BFCL's wheel, which is not installed: {INSTALL}"
        ) from None


def submodule(name: str) -> ModuleType:
    """A module of ``bfcl_eval`` (``constants.default_prompts``, ...); a :class:`ConfigError` if missing."""
    bfcl()
    try:
        return importlib.import_module(f"bfcl_eval.{name}")
    except ModuleNotFoundError as e:
        raise ConfigError(f"bfcl-eval's {name} needs {e.name!r}, which is not installed: {INSTALL}") from e


def category_name(category: str) -> str:
    """BFCL's name of a multi-turn category (``base`` and ``multi_turn_base`` both name the first)."""
    full = category if category.startswith("multi_turn_") else f"multi_turn_{category}"
    if full not in CATEGORIES:
        short = [c.removeprefix("multi_turn_") for c in CATEGORIES]
        raise ConfigError(f"unknown BFCL multi-turn category {category!r}; known: {short}")
    return full


def split_of(task_id: str) -> str:
    """``"test"`` for the held-out fifth of the tasks (by a hash of the id: stable, disjoint), else train."""
    digest = hashlib.sha256(task_id.encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") % _TEST_SHARE == 0 else "train"


@dataclass(frozen=True, slots=True)
class BFCLTask:
    """One BFCL multi-turn test entry with its ground truth."""

    id: str
    """BFCL's id, e.g. ``multi_turn_base_0``."""
    category: str
    """Its category (``multi_turn_base``, ...)."""
    questions: tuple[tuple[Mapping[str, str], ...], ...]
    """The user messages of each turn (a ``miss_func`` turn that reveals functions has none)."""
    initial_config: Mapping[str, Any]
    """The backends' initial state (deep-copied into every instance, never modified)."""
    involved_classes: tuple[str, ...]
    """The backend classes of the task."""
    missed_function: Mapping[int, tuple[str, ...]]
    """Functions held out until the turn that reveals them (``miss_func`` only)."""
    ground_truth: tuple[tuple[str, ...], ...]
    """BFCL's ground-truth call strings per turn (its data; run by its own executor only)."""

    @property
    def long_context(self) -> bool:
        """Whether BFCL loads the backends with their long-context extensions (as its checker decides)."""
        return "long_context" in self.category or "composite" in self.category


def _jsonl(path: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@functools.cache
def load_tasks(category: str) -> tuple[BFCLTask, ...]:
    """All tasks of a category, in BFCL's order, read from the wheel (offline)."""
    from importlib.resources import files

    category = category_name(category)
    data = files(bfcl()).joinpath("data")
    entries = _jsonl(data.joinpath(f"BFCL_v4_{category}.json"))
    answers = {
        a["id"]: a["ground_truth"]
        for a in _jsonl(data.joinpath("possible_answer", f"BFCL_v4_{category}.json"))
    }
    tasks = []
    for e in entries:
        if e["id"] not in answers:
            raise ConfigError(
                f"BFCL's data has no ground truth for {e['id']!r} (a broken bfcl-eval install?)"
            )
        tasks.append(
            BFCLTask(
                id=e["id"],
                category=category,
                questions=tuple(tuple(turn) for turn in e["question"]),
                initial_config=e.get("initial_config", {}),
                involved_classes=tuple(e["involved_classes"]),
                missed_function={int(k): tuple(v) for k, v in e.get("missed_function", {}).items()},
                ground_truth=tuple(tuple(turn) for turn in answers[e["id"]]),
            )
        )
    return tuple(tasks)


# -- function docs as tools ---------------------------------------------------------------------------
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "integer": "integer", "string": "string"}


def _json_schema(doc: Any, *, top: bool = False) -> Any:
    """A BFCL parameter doc (its own type names: dict, float, tuple, any) as JSON Schema."""
    if not isinstance(doc, Mapping):
        return doc
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key == "type":
            if value != "any":
                out["type"] = _TYPES.get(value, value)
        elif key == "properties":
            out["properties"] = {k: _json_schema(v) for k, v in value.items()}
        elif key == "items":
            out["items"] = _json_schema(value)
        else:
            out[key] = value
    if top:
        out.setdefault("type", "object")
        out.setdefault("properties", {})
        out["additionalProperties"] = False  # an unknown keyword is the model's mistake, said as such
    return out


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    """One function of a backend, from BFCL's doc: what the model sees and how its arguments are checked."""

    name: str
    class_name: str
    schema: Mapping[str, Any]
    """The OpenAI function schema (name, BFCL's description, parameters as JSON Schema)."""
    validator: Any
    """A ``jsonschema`` validator of the parameters."""


@functools.cache
def function_specs(class_name: str) -> tuple[FunctionSpec, ...]:
    """The functions BFCL documents for one backend class (docs that name no public method are left out)."""
    from importlib.resources import files

    from jsonschema.validators import validator_for

    config = submodule("constants.executable_backend_config")
    mapping: Mapping[str, str] = config.MULTI_TURN_FUNC_DOC_FILE_MAPPING
    if class_name not in mapping or class_name not in config.CLASS_FILE_PATH_MAPPING:
        raise ConfigError(f"BFCL has no multi-turn backend {class_name!r}")
    docs = _jsonl(files(bfcl()).joinpath("data", "multi_turn_func_doc", mapping[class_name]))
    methods = set(_public_methods(backend_class(class_name)))
    specs = []
    for d in docs:
        if d["name"] not in methods:
            continue
        params = _json_schema(d.get("parameters", {}), top=True)
        schema = {
            "type": "function",
            "function": {"name": d["name"], "description": d.get("description", ""), "parameters": params},
        }
        specs.append(FunctionSpec(d["name"], class_name, schema, validator_for(params)(params)))
    return tuple(specs)


@functools.cache
def backend_class(class_name: str) -> type:
    """BFCL's backend class by name (``GorillaFileSystem``, ``TradingBot``, ...)."""
    config = submodule("constants.executable_backend_config")
    module = importlib.import_module(config.CLASS_FILE_PATH_MAPPING[class_name])
    cls: type = getattr(module, class_name)
    return cls


def _public_methods(cls: type) -> list[str]:
    return [n for n, f in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")]


def format_result(value: Any) -> str:
    """A backend's return value as BFCL's executor writes it (so its response check compares like things)."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class Backends:
    """One episode's own instances of the task's backend classes, loaded with its initial state.

    Only :meth:`call` reaches them, and only for a name in the allow-list: the functions the task's docs
    list that are public methods of an involved class (a later class wins a shared name, as in BFCL).
    """

    def __init__(self, task: BFCLTask):
        stateless = set(submodule("constants.executable_backend_config").STATELESS_CLASSES)
        self.instances: dict[str, Any] = {}
        self.specs: dict[str, FunctionSpec] = {}
        for class_name in task.involved_classes:
            instance = backend_class(class_name)()
            if class_name not in stateless:
                state = copy.deepcopy(dict(task.initial_config.get(class_name, {})))
                instance._load_scenario(state, long_context=task.long_context)
            self.instances[class_name] = instance
            for spec in function_specs(class_name):
                self.specs[spec.name] = spec

    def call(self, name: str, arguments: Mapping[str, Any]) -> tuple[bool, str]:
        """Run one allowed call with keyword arguments; ``(ran, result)``: ``ran`` is False when the call
        was refused (unknown name, arguments against the schema) and nothing ran."""
        spec = self.specs.get(name)
        if spec is None:
            return False, f"Error: {name!r} is not one of the available functions."
        problems = sorted(spec.validator.iter_errors(dict(arguments)), key=lambda e: list(e.path))
        if problems:
            text = "; ".join(
                f"{'/'.join(map(str, e.path)) or '(arguments)'}: {e.message}" for e in problems[:5]
            )
            return False, f"Error: bad arguments for {name!r}: {text}"
        method = getattr(self.instances[spec.class_name], spec.name)  # an allow-listed public method only
        try:
            return True, format_result(method(**dict(arguments)))
        except Exception as e:  # the backend's own refusal (BFCL's executor reports it the same way)
            return True, f"Error during execution: {e}"


# -- the ground truth ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ParsedCall:
    """A ground-truth call string read as data (``ast``; never evaluated): a name and keyword arguments."""

    name: str
    arguments: Mapping[str, Any]


def parse_call_string(call: str, class_names: Sequence[str]) -> ParsedCall:
    """Read one of BFCL's ground-truth call strings (``f(a=1, b='x')`` or positional) as a name and
    keyword arguments; positional values take the parameter names of the backend method's signature."""
    node = ast.parse(call.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ConfigError(f"not a plain call in BFCL's ground truth: {call!r}")
    name = node.func.id
    args: dict[str, Any] = {}
    if node.args:
        owner = next(
            (backend_class(c) for c in reversed(class_names) if hasattr(backend_class(c), name)), None
        )
        if owner is None:
            raise ConfigError(f"BFCL's ground truth calls {name!r}, which no involved class has")
        params = [p for p in inspect.signature(getattr(owner, name)).parameters if p != "self"]
        for param, value in zip(params, node.args, strict=False):
            args[param] = ast.literal_eval(value)
    for kw in node.keywords:
        if kw.arg is None:
            raise ConfigError(f"**kwargs in BFCL's ground truth: {call!r}")
        args[kw.arg] = ast.literal_eval(kw.value)
    return ParsedCall(name, args)


class GroundTruthChecker:
    """BFCL's per-turn check of one episode, with BFCL's own code on both sides of the comparison.

    The ground truth runs through BFCL's executor (``execute_multi_turn_func_call``, its call strings, its
    instances kept in that module's globals under a name unique to this episode, removed by :meth:`close`).
    The model's side is the episode's :class:`Backends` and the results its calls returned. Each turn is
    judged as BFCL's ``multi_turn_checker`` judges it: a turn whose ground truth has calls needs at least
    one call of the model, then ``state_checker`` on the instances and ``response_checker`` on all of the
    model's results so far against the turn's ground-truth results; a turn without ground truth is not
    checked (its calls still run, so the next turn's state check sees them).
    """

    def __init__(self, task: BFCLTask):
        self.task = task
        self._utils = submodule("eval_checker.multi_turn_eval.multi_turn_utils")
        self._checker = submodule("eval_checker.multi_turn_eval.multi_turn_checker")
        self._name = f"agentrl_{uuid4().hex}"
        self.model_results: list[str] = []

    def check_turn(
        self, turn: int, backends: Backends, results: Sequence[str], called: bool
    ) -> dict[str, Any]:
        """Run turn ``turn``'s ground truth and judge the model's turn; BFCL's verdict dict (``valid``...)."""
        calls = list(self.task.ground_truth[turn])
        gt_results, gt_instances = self._utils.execute_multi_turn_func_call(
            func_call_list=calls,
            initial_config=copy.deepcopy(dict(self.task.initial_config)),
            involved_classes=list(self.task.involved_classes),
            model_name=f"{self._name}_ground_truth",
            test_entry_id=self.task.id,
            long_context=self.task.long_context,
            is_evaL_run=True,
        )
        self.model_results.extend(results)
        if not calls:
            return {"valid": True}
        if not called:
            return {
                "valid": False,
                "error_message": f"Model response list is empty for turn {turn}",
                "error_type": "multi_turn:empty_turn_model_response",
            }
        verdict: dict[str, Any] = self._checker.state_checker(backends.instances, gt_instances)
        if not verdict["valid"]:
            return verdict
        verdict = self._checker.response_checker(self.model_results, gt_results, turn)
        return verdict

    def close(self) -> None:
        """Drop this episode's ground-truth instances from BFCL's executor module."""
        space = vars(self._utils)
        for key in [k for k in space if k.startswith(self._name)]:
            del space[key]
