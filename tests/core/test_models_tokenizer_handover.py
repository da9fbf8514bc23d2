"""The tokenizer the Ray driver hands to its actors (pickled once, unpickled in each) is the same tokenizer,
and once handed over (:func:`agentrl.models.use_tokenizer`) ``resolve_tokenizer`` loads nothing.

Template drift is what users notice first, so the comparison covers everything a rollout reads from a
tokenizer: its class, the tokenizers-backend JSON, the vocabulary, special and added tokens, encodings
(special-token strings and unicode included) and ``apply_chat_template`` with and without tools and a
generation prompt, for every tokenizer folder available offline here.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentrl import models
from agentrl.errors import ConfigError
from agentrl.models import load_tokenizer, resolve_tokenizer, smollm2_dir, use_tokenizer

QWEN_TEMPLATE = (
    Path(__file__).parents[1] / "fidelity" / "fixtures" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
)

TEXTS = (
    "Hello, world!",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|im_end|> glued<|im_start|>",
    "naïve café — 数学 🧮 ∑x² Ωμέγα\u200bzero-width",
    "  leading spaces\tand\ttabs\n\n\ntrailing  ",
    '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
    "<|handover|> agentrlword<|handover|>",
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]

MESSAGES = [
    {"role": "system", "content": "You are terse. Répondez en français — 数学."},
    {"role": "user", "content": "What is 2+2? 🧮"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And <|im_end|> as text?"},
]


def _fields(tok: Any) -> dict[str, Any]:
    """Everything the rollout reads from a tokenizer, as plain data."""
    added = {
        i: (t.content, t.special, t.lstrip, t.rstrip, t.normalized, t.single_word)
        for i, t in tok.added_tokens_decoder.items()
    }
    out: dict[str, Any] = {
        "class": type(tok),
        "backend": tok.backend_tokenizer.to_str(),
        "len": len(tok),
        "vocab": tok.get_vocab(),
        "added": added,
        "special": (tok.all_special_tokens, tok.all_special_ids),
        "ids": (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id),
        "sides": (tok.padding_side, tok.truncation_side, tok.model_max_length),
        "template": tok.chat_template,
    }
    for k, text in enumerate(TEXTS):
        ids = tok.encode(text, add_special_tokens=False)
        out[f"text{k}"] = (
            ids,
            tok.encode(text),
            tok(text)["input_ids"],
            tok.convert_ids_to_tokens(ids),
            tok.decode(ids, skip_special_tokens=False),
            tok.decode(ids, skip_special_tokens=True),
        )
    for tools in (None, TOOLS):
        for gen in (False, True):
            out[f"chat tools={tools is not None} gen={gen}"] = (
                tok.apply_chat_template(MESSAGES, tools=tools, add_generation_prompt=gen, tokenize=False),
                list(
                    tok.apply_chat_template(MESSAGES, tools=tools, add_generation_prompt=gen, tokenize=True)
                ),
            )
    return out


@pytest.fixture(scope="module")
def variant_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer folder as a run's checkpoint holds one, with what the SmolLM2 folder lacks: another
    model's chat template (Qwen2.5's, which renders tools), an added special token and an added word."""
    tok = load_tokenizer(smollm2_dir())  # a fresh object: the process's cached one stays untouched
    tok.chat_template = QWEN_TEMPLATE.read_text()
    tok.add_special_tokens({"additional_special_tokens": ["<|handover|>"]})
    tok.add_tokens(["agentrlword"])
    folder = tmp_path_factory.mktemp("variant-tokenizer")
    tok.save_pretrained(str(folder))
    return folder


def _pickle(tok: Any) -> Any:
    return pickle.loads(pickle.dumps(tok, protocol=pickle.HIGHEST_PROTOCOL))


def _cloudpickle(tok: Any) -> Any:
    cloudpickle = pytest.importorskip("ray.cloudpickle")  # how ray.put serializes an actor's argument
    return pickle.loads(cloudpickle.dumps(tok))


@pytest.mark.parametrize("roundtrip", [_pickle, _cloudpickle], ids=["pickle", "ray-cloudpickle"])
@pytest.mark.parametrize("which", ["tiny", "variant folder"])
def test_an_unpickled_tokenizer_equals_the_original(
    which: str, roundtrip: Callable[[Any], Any], variant_folder: Path
) -> None:
    tok = resolve_tokenizer("tiny" if which == "tiny" else variant_folder)
    if which != "tiny":  # the variant really differs from SmolLM2's own tokenizer (or it tests nothing new)
        assert tok.chat_template != resolve_tokenizer("tiny").chat_template
        assert "<|handover|>" in tok.all_special_tokens and "agentrlword" in tok.get_vocab()
    copy = roundtrip(tok)
    assert copy is not tok
    want, got = _fields(tok), _fields(copy)
    assert want.keys() == got.keys()
    for key in want:
        assert got[key] == want[key], key
    # the copy renders tool prompts in full (Qwen2.5's template writes the schema) as the original does
    with_tools = got["chat tools=True gen=True"][0]
    assert with_tools.endswith("<|im_start|>assistant\n")
    if which != "tiny":
        assert '"name": "add"' in with_tools


def test_a_handed_over_tokenizer_is_what_resolve_tokenizer_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "_HANDED", {})  # this process's registry stays as the other tests left it
    tok = _pickle(resolve_tokenizer("tiny"))
    use_tokenizer("handover-test-model", tok)
    assert resolve_tokenizer("handover-test-model") is tok
    assert resolve_tokenizer(Path("handover-test-model")) is tok  # a path-like names the same model
    assert resolve_tokenizer("tiny") is not tok  # the exact name only
    with pytest.raises(
        ConfigError, match=r"use_tokenizer\('x', \.\.\.\): expected a Hugging Face tokenizer.*dict"
    ):
        use_tokenizer("x", {"vocab": {}})  # type: ignore[arg-type]


_CHILD = """
import json, pickle, sys
from agentrl.models import resolve_tokenizer, use_tokenizer
with open(sys.argv[1], "rb") as fh:
    tok = pickle.load(fh)
use_tokenizer("tiny", tok)
got = resolve_tokenizer("tiny")
out = {
    "same": got is tok,
    "ids": got.encode(sys.argv[2], add_special_tokens=False),
    "light": "transformers.configuration_utils" not in sys.modules,
}
print(json.dumps(out))
"""


def test_a_handed_over_tokenizer_loads_no_model_machinery(tmp_path: Path) -> None:
    tok = resolve_tokenizer("tiny")
    path = tmp_path / "tok.pkl"
    path.write_bytes(pickle.dumps(tok, protocol=pickle.HIGHEST_PROTOCOL))
    text = TEXTS[3]
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), text], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["same"] and out["ids"] == tok.encode(text, add_special_tokens=False)
    assert out["light"], "resolve_tokenizer imported transformers.configuration_utils after use_tokenizer"
    # the module checked for is real: loading through AutoTokenizer (resolve_tokenizer above) imported it
    assert "transformers.configuration_utils" in sys.modules
