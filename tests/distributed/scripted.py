"""A scripted sampler for math-tir with sleep-bound latency: the Ray runtime's tests and benchmarks.

A test fake, so it lives under tests/ and is not installed. Ray actors unpickle the policy factory in other
processes, where this file's module name (``distributed.scripted`` under pytest, ``scripted`` for
``drive.py``, ``tests.distributed.scripted`` for the benchmarks) may not be importable: the module is
therefore registered with Ray's cloudpickle to travel by value, and the actors need only ``agentrl``.

:class:`ScriptedTIRPolicy` is an :class:`~agentrl.protocols.UpdatablePolicy` that plays math-tir tasks the
way a model would, through the real environment and the real sandbox: it writes a python block computing the
question, reads the tool's output and answers. Which of four plans it plays (right answer, a wrong digit
appended, a syntax error first, no tool) is a function of the turn's sampling seed, which the rollout derives
from ``(rollout seed, group seed, member, turn)``: so a run is reproducible token for token whichever process
or server samples it, and members of a group differ (so advantages are not all zero).

``generate_s`` sleeps per turn (a stand-in for decoding time) and the python block sleeps ``tool_s`` inside
the sandbox (a stand-in for tool work): both are sleep-bound, so throughput scales with workers even on a
2-core machine. The recorded log-probs are a constant -0.5.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.protocols import FinishReason, Generation, Sampling, UpdatablePolicy, WeightUpdate

__all__ = ["ScriptedTIRFactory", "ScriptedTIRPolicy"]

try:
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
except ImportError:  # without the ray extra the Ray tests skip, and nothing is pickled
    pass


class ScriptedTIRPolicy:
    """Plays math-tir tasks with one of four plans per episode, chosen by the turn's sampling seed."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        generate_s: float = 0.0,
        tool_s: float = 0.0,
        jitter_s: Sequence[float] = (),
        version: int = 0,
    ):
        self.tokenizer = tokenizer
        self.end = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.generate_s, self.tool_s = generate_s, tool_s
        self.jitter_s = tuple(jitter_s)
        self._version = version
        self.loaded: dict[str, Any] = {}
        """The tensors of the last weight update (what a server checksums)."""

    @property
    def version(self) -> int:
        """Version of the last weights taken."""
        return self._version

    async def load_weights(self, update: WeightUpdate) -> None:
        """Take the version (and keep the tensors, so a server can checksum what it holds)."""
        update.check_after(self._version)
        self.loaded = dict(update.named_tensors)
        self._version = update.version

    def _turn(self, prompt: str, plan: int) -> str:
        question = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, re.S)[-1]
        after = prompt.rsplit(question, 1)[1]
        expr = re.search(r"What is (.+?)\?", question)
        expr_s = expr.group(1) if expr else "0"
        if "```output" not in after:
            if plan == 3:
                return f"Answer: {_eval(expr_s)}"
            sleep = f"import time; time.sleep({self.tool_s})\n" if self.tool_s else ""
            return f"```python\n{sleep}print({expr_s}" + ("" if plan == 2 else ")") + "\n```"
        outputs = re.findall(r"```output\n(.*?)```", after, re.S)
        value = outputs[-1].strip() if outputs else ""
        return {0: f"Answer: {value}", 1: f"Answer: {value}7"}.get(plan, "Answer: 7")

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """One scripted turn after ``generate_s`` seconds."""
        version = self._version
        delay = self.generate_s
        if self.jitter_s:  # a latency drawn from the turn's seed: random across turns, the same on a rerun
            pick = int(hashlib.sha256(str(sampling.seed).encode()).hexdigest(), 16) % len(self.jitter_s)
            delay += self.jitter_s[pick]
        if delay:
            await asyncio.sleep(delay)
        prompt = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        # The plan is fixed per episode: the seed of turn t is the seed of turn 0 plus t.
        turn = prompt.count("<|im_start|>assistant") - 1
        plan = ((sampling.seed or 0) - max(turn, 0)) % 4
        ids = [*self.tokenizer.encode(self._turn(prompt, plan), add_special_tokens=False), self.end]
        ids = ids[: sampling.max_new_tokens]
        finish = FinishReason.STOP if ids[-1] == self.end else FinishReason.LENGTH
        return Generation(tuple(ids), (-0.5,) * len(ids), finish, version)


def _eval(expr: str) -> str:
    if not re.fullmatch(r"[\d\s+\-*/()]+", expr):
        return "0"
    try:
        return str(eval(expr, {"__builtins__": {}}))  # digits and operators only (checked above)
    except (SyntaxError, ZeroDivisionError):
        return "0"


@dataclass(frozen=True)
class ScriptedTIRFactory:
    """A server's policy factory (:data:`~agentrl.trainers.ray.actors.PolicyFactory`) building a
    :class:`ScriptedTIRPolicy` over the run's tokenizer."""

    generate_s: float = 0.0
    """Seconds each turn sleeps."""
    tool_s: float = 0.0
    """Seconds each python block sleeps in the sandbox."""
    jitter_s: tuple[float, ...] = ()
    """Extra seconds per turn, one of these picked by the turn's sampling seed (random latencies)."""

    def __call__(self, cfg: Any, version: int) -> UpdatablePolicy:
        """The policy, at ``version``."""
        from agentrl.models import resolve_tokenizer

        return ScriptedTIRPolicy(
            resolve_tokenizer(cfg.model),
            generate_s=self.generate_s,
            tool_s=self.tool_s,
            jitter_s=self.jitter_s,
            version=version,
        )


def handover_probe(actor: Any, model: str) -> dict[str, Any]:
    """Run inside a rollout worker or an inference server (``handle.__ray_call__.remote(handover_probe,
    model)``): the tokenizer it renders with, whether that is the one the driver handed over
    (:func:`agentrl.models.use_tokenizer`), what it renders, and whether the process has imported torch."""
    from agentrl import models

    handed = models._HANDED.get(model)
    used = actor.renderer.tokenizer if hasattr(actor, "renderer") else actor.policy.tokenizer
    return {
        "used_is_handed": handed is not None and used is handed,
        "resolves_to_handed": handed is not None and models.resolve_tokenizer(model) is handed,
        "backend": used.backend_tokenizer.to_str(),
        "chat": used.apply_chat_template([{"role": "user", "content": "2+2? 数学"}], tokenize=False),
        "torch": "torch" in sys.modules,
    }
