r"""``reasoning-gym:<dataset>``: every generator of the `reasoning-gym` library as an agentrl env.

``agentrl.make("reasoning-gym:chain_sum", max_terms=4)`` builds the library's own dataset (its config
fields come as keyword arguments: ``--env-kwargs '{"max_terms": 4}'``) and grades the final answer with the
dataset's own ``score_answer``: the reward is whatever the library gives, partial credit included. The
library is an optional extra (``pip install 'agentrl[reasoning-gym]'``), imported on the first ``make``;
``agentrl envs reasoning-gym`` lists the datasets.

The answer is the content of the last ``<answer>...</answer>`` (the library's own format), else the last
``Answer: ...`` line (``\boxed{}`` too); with ``python=True`` the model also has the sandboxed python tool
(```python blocks; a tool-integrated reasoning task).

Splits: one task is item ``seed % size`` of the dataset built with the library's ``seed`` set to 0 (train)
or ``TEST_SEED`` (test). The library draws item ``i`` of a dataset seeded ``s`` from ``Random(s + i)`` in all
but a few generators, so the two splits draw from disjoint random streams. That makes their *draws*
independent, not their *questions*: a generator with few distinct questions (two one-digit terms) repeats
some test questions in training, and a generator that samples a fixed pool of puzzles (``arc_agi``, ``rearc``)
or precomputes its items from ``seed`` (``acre``) draws test items from the same pool.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import warnings
from collections.abc import Mapping
from typing import Any

from agentrl import Message, Observation
from agentrl.errors import ConfigError
from agentrl.tools import ParsedTurn, PythonTool, extract_answer, strip_code_blocks

from .tool_env import Task, ToolEnv

INSTALL = "pip install 'agentrl[reasoning-gym]'"
TEST_SEED = 2**31
"""The library seed of the test split; the train split's is 0 (item ``i`` is drawn from ``Random(seed + i)``,
so the splits are disjoint for any ``size`` below 2**31)."""
RESERVED = ("seed",)
"""Config fields the env sets itself (the split decides the seed)."""
SYSTEM_PROMPT = "Solve the problem. End your reply with 'Answer: <your answer>'."
TIR_PROMPT = (
    "You solve problems, writing Python code when it helps.\n{tools}\n"
    "When you know the result, reply with 'Answer: <your answer>'."
)
TIR_EXAMPLE = (
    Message("user", "What is 352 + 1945 - 87?"),
    Message("assistant", "```python\nprint(352 + 1945 - 87)\n```"),
    Message("tool", "```output\n2210\n```", tool_call_id="example_0", name="python"),
    Message("assistant", "Answer: 2210"),
)
"""With the python tool: one worked example of the tool's format before the task (not one of the dataset's
items), as math-tir-v0 shows one: a 135M model rarely writes a python block without it."""
_TAGGED = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)


def _library() -> Any:
    try:
        import reasoning_gym.factory
    except ImportError as e:
        raise ConfigError(f"the reasoning-gym envs need the reasoning-gym library: {INSTALL}") from e
    return reasoning_gym.factory


def dataset_names() -> list[str]:
    """Every dataset the installed reasoning-gym registers (``agentrl envs reasoning-gym``)."""
    return sorted(_library().DATASETS)


def config_fields(dataset: str) -> dict[str, Any]:
    """A dataset's config fields and their defaults, less the ones the env sets (``seed``)."""
    _, config_cls = _dataset(dataset)
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else None
        for f in dataclasses.fields(config_cls)
        if f.name not in RESERVED
    }


def _dataset(name: str) -> tuple[type, type]:
    datasets = _library().DATASETS
    if name not in datasets:
        close = difflib.get_close_matches(name, list(datasets), n=3)
        hint = f" Did you mean {sorted(close)}?" if close else " `agentrl envs reasoning-gym` lists them."
        raise ConfigError(f"reasoning-gym has no dataset {name!r}.{hint}")
    cls, config_cls = datasets[name]
    return cls, config_cls


def final_answer(text: str) -> str | None:
    r"""What a final turn answers: the last ``<answer>`` tag's content, else its ``Answer:``/``\boxed{}``."""
    prose = strip_code_blocks(text)
    tagged = _TAGGED.findall(prose)
    if tagged:
        return str(tagged[-1]).strip()
    return extract_answer(prose)


class ReasoningGymEnv(ToolEnv):
    """A reasoning-gym dataset (``reasoning-gym:<dataset>``), graded by the dataset's own ``score_answer``.

    Args:
        dataset: The generator's name (``chain_sum``, ``leg_counting``, ...).
        split: ``"train"`` or the held-out ``"test"`` (another library seed, module docstring).
        python: Give the model the sandboxed python tool (tool-integrated reasoning), with one worked
            example of its format (``TIR_EXAMPLE``).
        python_timeout: Seconds per python run.
        **config: The dataset's own config fields (``size`` included: how many items a split cycles
            through); an unknown field is an error that lists the valid ones. Keyword arguments of
            :class:`ToolEnv` (``sandbox_factory``, ``sandbox_pool``, ``limits``, ``system_prompt``, ...) pass
            through.
    """

    def __init__(
        self,
        dataset: str,
        *,
        split: str = "train",
        python: bool = False,
        python_timeout: float = 10.0,
        **config: Any,
    ):
        if split not in ("train", "test"):
            raise ConfigError(f"split must be 'train' or 'test', got {split!r}")
        cls, config_cls = _dataset(dataset)
        fields = {f.name for f in dataclasses.fields(config_cls)}
        base = {k: config.pop(k) for k in list(config) if k in _TOOL_ENV_ARGS}
        reserved = sorted(set(config) & set(RESERVED))
        if reserved:
            raise ConfigError(f"reasoning-gym:{dataset}: {reserved} is set by the env from the split")
        unknown = sorted(set(config) - fields)
        if unknown:
            valid = ", ".join(f"{k}={v!r}" for k, v in config_fields(dataset).items())
            raise ConfigError(f"reasoning-gym:{dataset} has no config field {unknown}; its fields: {valid}")
        seed = 0 if split == "train" else TEST_SEED
        try:
            cfg = config_cls(**config, seed=seed) if "seed" in fields else config_cls(**config)
            self.data = cls(config=cfg)
        except (AssertionError, ValueError, TypeError) as e:  # the library validates with assert
            raise ConfigError(f"reasoning-gym:{dataset} refused its config {config}: {e!s}") from e
        self.dataset, self.split, self.python = dataset, split, python
        self.size = int(getattr(self.data, "size", 0) or getattr(cfg, "size", 0) or 500)
        self.entry: Mapping[str, Any] = {}
        self._seed: int | None = None
        tools = [PythonTool(timeout=python_timeout)] if python else []
        base.setdefault("system_prompt", TIR_PROMPT if python else SYSTEM_PROMPT)
        if python:
            base.setdefault("fewshot", TIR_EXAMPLE)
        super().__init__(tools, parser="python" if python else "hermes", **base)

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Item ``seed % size`` of this split's dataset (a seedless reset draws one from ``rng``)."""
        self._seed = seed
        return await super().reset(seed=seed, options=options)

    def make_task(self, options: dict[str, Any]) -> Task:
        """The dataset's item for this episode's seed; its question is the prompt."""
        index = self._seed % self.size if self._seed is not None else self.rng.randrange(self.size)
        self.entry = self.data[index]
        info = {
            "task_id": f"{self.dataset}/{self.split}/{index}",
            "dataset": self.dataset,
            "split": self.split,
            "index": index,
            "answer": str(self.entry.get("answer")),
        }
        return Task(prompt=str(self.entry["question"]), answer=self.entry.get("answer"), info=info)

    def score(self, parsed: ParsedTurn) -> float:
        """The dataset's own ``score_answer`` on the final answer (``None`` when there is none). A few of
        the library's scorers raise on an answer they cannot parse (``prime_factorization`` on words,
        ``boxnet`` on a bare number) where the others return 0: such an answer scores 0 too, since it is the
        model's malformed answer, not a failure of the env."""
        answer = final_answer(parsed.content)
        try:
            with warnings.catch_warnings():  # e.g. numpy's "input contained no data" on an empty answer
                warnings.simplefilter("ignore")
                return float(self.data.score_answer(answer, self.entry))
        except Exception:
            return 0.0

    def sample_actions(self) -> tuple[str, ...]:
        """The dataset's reference answer, when the dataset's own scorer accepts it (some datasets, such as
        ``graph_color``, have many right answers and no single reference: then none)."""
        answer = self.entry.get("answer")
        if answer is None or not float(self.data.score_answer(str(answer), self.entry)) > 0:
            return ()
        final = f"<answer>{answer}</answer>"
        if self.python:
            return ("```python\nprint('checked')\n```", final)
        return (final,)


_TOOL_ENV_ARGS = frozenset(
    {
        "system_prompt",
        "fewshot",
        "tool_timeout",
        "max_calls_per_turn",
        "sandbox_factory",
        "sandbox_pool",
        "limits",
        "tools_in_prompt",
        "tool_format",
    }
)
"""Keyword arguments that belong to :class:`ToolEnv`, not to the dataset's config."""
