"""Which tokenizer a trajectory's token ids belong to: a name to load it by and a fingerprint to check it.

Token ids mean nothing without their tokenizer, so every trajectory the rollout records names it
(``"tokenizer": {"name", "vocab_size", "fingerprint"}`` in its JSON line): ``agentrl replay --check`` finds
it without ``--tokenizer`` and refuses a look-alike. The fingerprint hashes what decides how ids map to
text and turns: the vocabulary (with added tokens), the special and added tokens, and the chat template.
This module imports neither torch nor transformers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["TokenizerInfo", "tokenizer_info"]

_CACHE_ATTR = "_agentrl_tokenizer_info"


@dataclass(frozen=True, slots=True)
class TokenizerInfo:
    """A tokenizer's identity as recorded with trajectories."""

    name: str
    """What it was loaded from (``name_or_path``: a folder, ``smollm2`` or a hub name)."""
    vocab_size: int
    """``len(tokenizer)``: the vocabulary including added tokens."""
    fingerprint: str
    """``sha256:`` + 16 hex digits over the vocabulary, special/added tokens and chat template."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (a trajectory line's ``tokenizer`` entry)."""
        return {"name": self.name, "vocab_size": self.vocab_size, "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TokenizerInfo:
        """Inverse of :meth:`to_dict`."""
        return cls(str(d.get("name", "")), int(d.get("vocab_size", 0)), str(d.get("fingerprint", "")))

    def matches(self, tokenizer: Any) -> bool:
        """``tokenizer`` has this fingerprint."""
        other = tokenizer_info(tokenizer)
        return other is not None and other.fingerprint == self.fingerprint


def tokenizer_info(tokenizer: Any) -> TokenizerInfo | None:
    """The identity of a Hugging Face tokenizer (computed once per tokenizer object, ~0.1 s for a 49k
    vocabulary); None for an object without a vocabulary (a test double)."""
    # The cache is keyed by what is commonly changed in place (added tokens, a new chat template).
    key = (len(tokenizer) if hasattr(tokenizer, "__len__") else -1, getattr(tokenizer, "chat_template", None))
    cached = getattr(tokenizer, _CACHE_ATTR, None)
    if isinstance(cached, tuple) and cached[0] == key:
        hit: TokenizerInfo | None = cached[1]
        return hit
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if not callable(get_vocab):
        return None
    vocab = get_vocab()
    if not isinstance(vocab, Mapping):
        return None
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    described = {
        "vocab": sorted((str(k), int(v)) for k, v in vocab.items()),
        "added": sorted(
            (int(i), str(getattr(t, "content", t)), bool(getattr(t, "special", False)))
            for i, t in added.items()
        ),
        "special": sorted(str(t) for t in (getattr(tokenizer, "all_special_tokens", None) or ())),
        "chat_template": str(getattr(tokenizer, "chat_template", None) or ""),
    }
    digest = hashlib.sha256(json.dumps(described, separators=(",", ":")).encode()).hexdigest()
    info = TokenizerInfo(
        str(getattr(tokenizer, "name_or_path", "") or ""), len(vocab), f"sha256:{digest[:16]}"
    )
    try:
        setattr(tokenizer, _CACHE_ATTR, (key, info))
    except (AttributeError, TypeError):  # a tokenizer that takes no attributes is hashed each time
        pass
    return info
