"""Make a real ``agentrl train`` run whose episodes call tools and earn rewards, in a few seconds on CPU.

The tiny random model never stops on its own, so its episodes are single cut turns with reward 0 (no tool
call, all-zero advantages). For replay tests that need tool calls, rewards that differ inside a group and
non-zero losses, this script runs the trainer (``agentrl.trainers.train.main``: tiny model as the learner,
real math-tir-v0 env, real local sandbox, OTB, checkpoints, metrics) with one substitution: the sampler is
a scripted policy. It writes a python block that computes the question, reads the tool output and answers
with it (plan 0: right), with it plus a wrong digit (plan 1), after a syntax error (plan 2), or answers
right away without a tool (plan 3). Its recorded log-probs are a constant -0.5, so the run also has a large,
known training-inference mismatch.

Usage: ``python tests/replay/make_run.py OUT_DIR``
"""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Sequence
from typing import Any

from agentrl.protocols import FinishReason, Generation, Sampling, WeightUpdate

PLANS = 4


class ScriptedTIR:
    """Stands in for ``HFPolicy`` (same constructor) and plays one of four plans per episode."""

    def __init__(
        self, model: Any, tokenizer: Any = None, *, stop_token_ids: Sequence[int], version: int = 0, **_: Any
    ):
        self.tokenizer = tokenizer
        self.end = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        assert self.end in stop_token_ids
        self._version = version
        self._plans = itertools.count()

    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = version

    async def load_weights(self, update: WeightUpdate) -> None:
        """Like HFPolicy sharing the learner's model: nothing to copy, take the version."""
        update.check_after(self._version)
        self._version = update.version

    def _turn(self, prompt: str) -> str:
        question = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, re.S)[-1]
        after = prompt.rsplit(question, 1)[1]
        expr = re.search(r"What is (.+)\?", question)
        assert expr is not None, question
        expr_s = expr.group(1)
        done = re.findall(r"# plan (\d)", after)
        if not done:
            plan = next(self._plans) % PLANS
            if plan == 3:
                return f"Answer: {eval(expr_s)}"  # the arithmetic of the task, computed here
            code = f"# plan {plan}\nprint({expr_s}" + ("" if plan == 2 else ")")
            return f"```python\n{code}\n```"
        plan = int(done[-1])
        outputs = re.findall(r"```output\n(.*?)```", after, re.S)
        value = outputs[-1].strip() if outputs else ""
        if plan == 0:
            return f"Answer: {value}"
        if plan == 1:
            return f"Answer: {value}7"
        return "Answer: 7"

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        prompt = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        ids = [*self.tokenizer.encode(self._turn(prompt), add_special_tokens=False), self.end]
        ids = ids[: sampling.max_new_tokens]
        finish = FinishReason.STOP if ids[-1] == self.end else FinishReason.LENGTH
        return Generation(tuple(ids), (-0.5,) * len(ids), finish, self._version)


def main(out: str) -> int:
    from agentrl.learner import LearnerConfig
    from agentrl.rollout import RolloutConfig
    from agentrl.trainers import factories, local, train
    from agentrl.trainers.evaluate import EvalConfig

    # Where the sampler is built (factories) and where the local runtime recognises one sharing the
    # learner's model (local): the scripted sampler stands in for HFPolicy in both.
    factories.HFPolicy = ScriptedTIR  # type: ignore[misc,assignment]
    local.HFPolicy = ScriptedTIR  # type: ignore[misc,assignment]
    cfg = train.TrainConfig(
        model="tiny",
        env="math-tir-v0",
        env_kwargs={"kinds": ["arithmetic"]},
        estimator="otb",
        group_size=4,
        groups_per_step=2,
        steps=2,
        out=out,
        rollout=RolloutConfig(max_turns=3, max_new_tokens=48, concurrency=8, on_template_mismatch="stop"),
        learner=LearnerConfig(lr=1e-3, micro_batch_tokens=4096),
        progress=False,
        eval=EvalConfig(tasks=0),  # no replay test reads eval.json; it was most of the run's cost
    )
    return train.main(cfg)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
