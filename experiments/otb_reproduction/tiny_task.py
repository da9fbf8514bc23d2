"""chain-sum: a small procedurally generated tool task for a tiny policy (built offline, in milliseconds).

The user gives K two-digit numbers; the model may not add them itself: it calls an ``add`` tool K − 1 times,
carrying the running sum, and ends with the answer. Every model turn first restates the numbers still to
be added (a scratchpad), so outputs are long-ish and most of their tokens only matter indirectly::

    <u>37 82 15 64<e>
    <a>[82 15 64]A37+82<e>   <t>119<e>       model turn 1, tool output (masked)
    <a>[15 64]A119+15<e>     <t>134<e>
    <a>[64]A134+64<e>        <t>198<e>
    <a>R198<e>                               final answer: reward 1 iff exactly the sum, else 0

One token per character, plus five control tokens. The same task runs through agentrl as a real
:class:`~agentrl.envs.tool_env.ToolEnv` (:class:`ChainSumEnv`: a custom parser, an ``@tool`` function, the
chat template below) and through the fast lockstep sampler in :mod:`fast_rollout`, which reuses this
module's parser and tool so the two cannot disagree (``tests/experiments`` checks it token for token).
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from agentrl.envs.tool_env import Task, ToolEnv
from agentrl.tools import ParsedTurn, tool
from agentrl.types import ToolCall

SPECIALS = ("<pad>", "<u>", "<a>", "<t>", "<e>")
"""Padding, user / assistant / tool turn starts, end of turn (the stop token)."""
CHARS = tuple("0123456789 +[]AR")
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<u>{{ m['content'] }}<e>"
    "{% elif m['role'] == 'assistant' %}<a>{{ m['content'] }}<e>"
    "{% elif m['role'] == 'tool' %}<t>{{ m['content'] }}<e>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
)
_CALL = re.compile(r"\[[0-9 ]*\]A(\d{1,5})\+(\d{1,5})")
_FINAL = re.compile(r"R(\d{1,5})")


def build_tokenizer(chars: Sequence[str] = CHARS) -> Any:
    """A character-level ``PreTrainedTokenizerFast`` with the chat template (21 tokens with this task's
    ``chars``, no files); other tiny tasks pass their own alphabet."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + tuple(chars))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="<pad>",
        eos_token="<e>",
        additional_special_tokens=["<u>", "<a>", "<t>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_policy(
    vocab_size: int, *, seed: int = 0, hidden: int = 64, layers: int = 2, max_positions: int = 512
) -> Any:
    """A random-init Llama-architecture causal LM (about 0.1 M parameters at the defaults)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=SPECIALS.index("<e>"),
        bos_token_id=None,
    )
    gen = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return LlamaForCausalLM(cfg).float()
    finally:
        torch.random.set_rng_state(gen)


# --------------------------------------------------------------------------------------------------
@tool(name="A", thread=False)  # named as the model writes it (agentrl's audit looks for the name)
def add(a: int, b: int) -> str:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return str(a + b)


class ChainParser:
    """``[..]A<a>+<b>`` is a call to the ``A`` (add) tool; ``R<n>`` is the final answer; anything else is
    a final turn without an answer (reward 0)."""

    name = "chain"

    def parse(self, text: str, *, id_prefix: str = "call") -> ParsedTurn:
        """Read one model turn (never raises)."""
        text = text.strip()
        m = _CALL.fullmatch(text)
        if m:
            args = json.dumps({"a": int(m.group(1)), "b": int(m.group(2))})
            return ParsedTurn(text, (ToolCall(f"{id_prefix}_0", "A", args),))
        m = _FINAL.fullmatch(text)
        return ParsedTurn(text, (), (), m.group(1) if m else None)

    def format_instructions(self, tools: Sequence[Any]) -> str:
        """The format is learned from demonstrations; nothing goes into the prompt."""
        return ""

    def format_output(self, name: str, content: str) -> str:
        """The tool's result, bare."""
        return content


def split_of(numbers: Sequence[int]) -> str:
    """``"test"`` for about one prompt in ten (a hash of the numbers), ``"train"`` otherwise."""
    return "test" if zlib.crc32(" ".join(map(str, numbers)).encode()) % 10 == 0 else "train"


def sample_numbers(rng: np.random.Generator, k: int, split: str) -> list[int]:
    """K two-digit numbers from ``split`` (rejection on the hash split)."""
    while True:
        nums = [int(x) for x in rng.integers(10, 100, size=k)]
        if split_of(nums) == split:
            return nums


def expert_turns(numbers: Sequence[int]) -> list[str]:
    """The model turns of a correct episode (without the stop token)."""
    acc = numbers[0]
    out = []
    for j in range(1, len(numbers)):
        rest = " ".join(map(str, numbers[j:]))
        out.append(f"[{rest}]A{acc}+{numbers[j]}")
        acc += numbers[j]
    out.append(f"R{acc}")
    return out


def prompt_text(numbers: Sequence[int]) -> str:
    """The user message."""
    return " ".join(map(str, numbers))


def turn_budget(k: int) -> int:
    """Most tokens one model turn may sample: the longest expert turn plus slack."""
    return 3 * k + 10


class ChainSumEnv(ToolEnv):
    """chain-sum as an agentrl ToolEnv: K numbers, an ``add`` tool, reward 1 for the exact sum.

    The turn limit is the rollout's: run it with ``RolloutConfig(max_turns=k + 1)``, as the fast sampler
    does.

    Args:
        k: How many numbers to add (K − 1 tool calls, K model turns when done right).
        split: ``"train"`` or the held-out ``"test"``.
    """

    def __init__(self, *, k: int = 4, split: str = "train", **kwargs: Any):
        self.k, self.split = k, split
        super().__init__([add], parser=ChainParser(), tools_in_prompt=True, **kwargs)

    def make_task(self, options: dict[str, Any]) -> Task:
        """A chain of numbers to add with the tool, from the split's range."""
        rng = np.random.default_rng(self.rng.randrange(2**31))
        nums = sample_numbers(rng, self.k, options.get("split", self.split))
        return Task(prompt=prompt_text(nums), answer=sum(nums), info={"numbers": " ".join(map(str, nums))})
