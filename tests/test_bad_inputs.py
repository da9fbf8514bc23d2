"""Bad inputs get clear errors (docs/reliability.md, "Bad inputs"): the rows no other test covered.

Each test asserts the message a user sees, so a regression to a bare library exception fails here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import agentrl
from agentrl.checkpoint import CheckpointState, load_checkpoint, save_checkpoint
from agentrl.envs.tool_env import Task, ToolEnv
from agentrl.errors import ConfigError, StoreError


def _tiny() -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg)


def test_an_env_class_without_step_says_which_method_is_missing(tmp_path: Path) -> None:
    f = tmp_path / "half_env.py"
    f.write_text(
        "import agentrl\n\n"
        "class Half(agentrl.Env):\n"
        "    async def reset(self, *, seed=None, options=None):\n"
        "        return (agentrl.Message('user', 'hi'),), {}\n"
    )
    with pytest.raises(ConfigError, match=r"cannot build '.*half_env\.py:Half'.*abstract method step"):
        agentrl.make(f"{f}:Half")


class _Tools(ToolEnv):
    def make_task(self, options: dict[str, Any]) -> Task:
        return Task("x")


@pytest.mark.parametrize("bad", [42, {"type": "function"}, "python"])
def test_a_tool_env_given_something_that_is_not_a_tool(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"a tool must be a Tool or a documented function, got"):
        _Tools([bad])  # type: ignore[list-item]


@pytest.mark.parametrize("damaged", ["model/model.safetensors", "optimizer.pt", "rng.pt"])
def test_a_damaged_checkpoint_file_is_a_store_error_naming_it(tmp_path: Path, damaged: str) -> None:
    model = _tiny()
    opt = torch.optim.AdamW(model.parameters())
    ckpt = save_checkpoint(tmp_path, model=model, optimizer=opt, state=CheckpointState(1, 1, {}))
    f = ckpt.path / damaged
    f.write_bytes(f.read_bytes()[:100])  # a disk that filled up mid-write
    other = _tiny()
    with pytest.raises(StoreError, match=rf"{damaged} is damaged"):
        load_checkpoint(ckpt, model=other, optimizer=torch.optim.AdamW(other.parameters()))


def test_a_tokenizer_without_a_chat_template_is_refused(tok: Any) -> None:
    from agentrl.chat import ChatRenderer

    plain = copy.copy(tok)
    plain.chat_template = None
    with pytest.raises(ConfigError, match="the tokenizer has no chat template; pass chat_template="):
        ChatRenderer(plain)
