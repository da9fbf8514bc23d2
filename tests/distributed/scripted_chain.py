"""A scripted sampler for long-chain-v0: plays a right chain from the context it is shown, so the env's
compaction really happens and episodes have several samples (a random tiny model never gets that far).

A test fake, registered with Ray's cloudpickle to travel by value (see :mod:`scripted` for why). The state is
read from the decoded context alone, as a model must: the last task message (the numbers, or the env's
compacted ``sum rest...``), then one number consumed per tool result, the running sum being the tool's
output. The recorded log-probs are a constant -0.5.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.protocols import FinishReason, Generation, Sampling, UpdatablePolicy, WeightUpdate

__all__ = ["ScriptedChainFactory", "ScriptedChainPolicy", "next_chain_turn"]

try:
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
except ImportError:  # without the ray extra the Ray tests skip, and nothing is pickled
    pass

_MESSAGE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", re.S)


def next_chain_turn(context: str) -> str:
    """The right next long-chain turn (env-compaction or truncate) for a decoded ChatML context."""
    msgs = [(role, text.strip()) for role, text in _MESSAGE.findall(context)]
    start = max(i for i, (role, text) in enumerate(msgs) if role == "user" and text[:1].isdigit())
    nums = [int(x) for x in msgs[start][1].split()]
    acc, rest = nums[0], nums[1:]
    for role, text in msgs[start + 1 :]:
        if role == "tool":  # a tool result: the running sum, one number consumed
            acc, rest = int(text), rest[1:]
    if not rest:
        return f"R{acc}"
    return f"[{' '.join(map(str, rest))}]A{acc}+{rest[0]}"


class ScriptedChainPolicy:
    """Plays long-chain tasks right, turn by turn."""

    def __init__(self, tokenizer: Any, *, version: int = 0):
        self.tokenizer = tokenizer
        self.end = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self._version = version

    @property
    def version(self) -> int:
        """Version of the last weights taken."""
        return self._version

    async def load_weights(self, update: WeightUpdate) -> None:
        """Take the version."""
        update.check_after(self._version)
        self._version = update.version

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """The right next turn."""
        prompt = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        ids = [*self.tokenizer.encode(next_chain_turn(prompt), add_special_tokens=False), self.end]
        ids = ids[: sampling.max_new_tokens]
        finish = FinishReason.STOP if ids[-1] == self.end else FinishReason.LENGTH
        return Generation(tuple(ids), (-0.5,) * len(ids), finish, self._version)


@dataclass(frozen=True)
class ScriptedChainFactory:
    """A server's policy factory building a :class:`ScriptedChainPolicy` over the run's tokenizer."""

    def __call__(self, cfg: Any, version: int) -> UpdatablePolicy:
        """The policy, at ``version``."""
        from agentrl.models import resolve_tokenizer

        return ScriptedChainPolicy(resolve_tokenizer(cfg.model), version=version)
