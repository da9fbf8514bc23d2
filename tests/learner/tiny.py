"""Tiny random-init HF causal LMs built in-process (no downloads)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

VOCAB = 300


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float32, vocab: int = VOCAB) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(cfg).to(dtype)


def tiny_qwen2(seed: int = 0, dtype: torch.dtype = torch.float32) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg).to(dtype)


def naive_logprobs(model, ids, attn, temperature=1.0):
    """Full-vocabulary log_softmax + gather: the reference for forward_logprobs."""
    logits = model(input_ids=ids, attention_mask=attn).logits
    ls = torch.log_softmax(logits.double() / temperature, dim=-1)
    lp = torch.zeros(ids.shape, dtype=torch.float64)
    lp[:, 1:] = ls[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    sp = torch.zeros(ids.shape, dtype=torch.float64)
    sp[:, 1:] = ls[:, :-1].exp().square().sum(-1)
    ent = torch.zeros(ids.shape, dtype=torch.float64)
    ent[:, 1:] = -(ls[:, :-1].exp() * ls[:, :-1]).sum(-1)
    valid = torch.zeros(ids.shape, dtype=torch.bool)
    valid[:, 1:] = attn[:, 1:] != 0
    z = torch.zeros((), dtype=torch.float64)
    return torch.where(valid, lp, z), torch.where(valid, sp, z), torch.where(valid, ent, z)
