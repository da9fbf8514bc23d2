"""LoRA: train low-rank adapters on a frozen base model, through ``peft``, with a record of the base.

``--lora.rank R`` (R > 0) injects peft LoRA layers into the model the run loads (:func:`apply_lora`). What
the rest of agentrl holds is still the Hugging Face model object (its linear layers are now peft
``lora.Linear`` modules wrapping the frozen originals), so the learner's forward, log-probs, Σπ² and every
estimator run through the adapted model unchanged; only the adapter's parameters require gradients, so the
learner's optimizer (built from ``requires_grad`` parameters) holds nothing else.

Three things change with adapters, and this module is where each is done:

* **Checkpoints** hold the adapter alone (peft's ``adapter_config.json`` + ``adapter_model.safetensors``, the
  format vLLM and the ecosystem load) and :data:`BASE_FILE`, a :class:`BaseRecord` naming the base model and
  the checksum of its weights. Loading an adapter onto another base is refused (:meth:`Adapted.load_adapter`).
* **Samplers** get the adapter's tensors only (:func:`adapter_state`): a few MB instead of the model. After a
  sync each sampler reports :func:`adapter_digest` of the adapter it generates with, which must equal the
  learner's (the failure this guards against: a sampler that never receives the adapter keeps sampling the
  initial policy, verl #7495).
* **Export** merges the adapter into the base (:meth:`Adapted.merged`) for a plain Hugging Face folder.

The adapter's initial values are drawn from a generator seeded by the run's seed (peft initialises ``lora_A``
randomly and ``lora_B`` to zero, so the adapted model starts exactly at the base), which lets replay rebuild
step 0's adapter bit for bit.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError, StoreError
from agentrl.weights import weights_checksum

if TYPE_CHECKING:
    import torch

__all__ = [
    "ADAPTER_CONFIG",
    "BASE_FILE",
    "Adapted",
    "BaseRecord",
    "LoraConfig",
    "adapter_digest",
    "adapter_state",
    "apply_lora",
    "base_record",
    "is_adapted",
    "is_adapter_folder",
    "load_adapted",
    "published_state",
    "read_base_record",
    "saved_config",
]

ADAPTER_CONFIG = "adapter_config.json"
"""peft's adapter settings file (its presence marks an adapter folder)."""
BASE_FILE = "agentrl_base.json"
"""The :class:`BaseRecord` of an adapter folder written by agentrl."""
_ADAPTER = "default"
_ALL_LINEAR = "all-linear"


@dataclass(frozen=True, slots=True)
class LoraConfig:
    """``--lora.*``: LoRA adapters instead of full fine-tuning (rank 0, the default, trains every weight)."""

    rank: int = 0
    """Rank R of each adapter (ΔW = B·A with A: R × in, B: out × R); 0 turns LoRA off."""
    alpha: float = 32.0
    """Scale of the adapter's output: ΔW is multiplied by alpha / rank. LoRA usually wants a learning rate
    about ten times full fine-tuning's (--learner.lr)."""
    dropout: float = 0.0
    """Dropout on the adapter's input during training steps (scoring and sampling never use it)."""
    targets: tuple[str, ...] = (_ALL_LINEAR,)
    """Module name patterns that get adapters, comma-separated on the command line (``q_proj,v_proj``): a name
    matches a module whose name ends with it, as peft matches; ``all-linear`` (the default) is every linear
    layer of the attention and MLP blocks (not the LM head)."""

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ConfigError(f"--lora.rank must be an integer >= 0 (0 = off), got {self.rank!r}")
        if not self.alpha > 0:
            raise ConfigError(f"--lora.alpha must be > 0, got {self.alpha!r}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"--lora.dropout must be in [0, 1), got {self.dropout!r}")
        if not self.targets or any(not isinstance(t, str) or not t for t in self.targets):
            raise ConfigError(f"--lora.targets must name at least one module pattern, got {self.targets!r}")
        if _ALL_LINEAR in self.targets and len(self.targets) > 1:
            raise ConfigError("--lora.targets: 'all-linear' already names every linear layer; give it alone")

    @property
    def enabled(self) -> bool:
        """LoRA is on (rank > 0)."""
        return self.rank > 0

    def peft_config(self) -> Any:
        """The ``peft.LoraConfig`` these settings stand for."""
        peft = _peft()
        targets: str | list[str] = _ALL_LINEAR if self.targets == (_ALL_LINEAR,) else list(self.targets)
        return peft.LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets,
            bias="none",
            init_lora_weights=True,
        )


@dataclass(frozen=True, slots=True)
class BaseRecord:
    """The base model an adapter was trained on (written as :data:`BASE_FILE` beside the adapter)."""

    name: str
    """The model setting it was loaded by (``smollm2``, ``tiny``, a folder)."""
    seed: int
    """``tiny``'s initialisation seed (ignored for other names)."""
    dtype: str
    """The dtype its weights were held in when :attr:`sha256` was taken."""
    sha256: str
    """:func:`agentrl.weights.weights_checksum` of the base weights in :attr:`dtype`."""

    def describe(self) -> str:
        """``smollm2 (float32 sha256:0123456789abcdef)``."""
        return f"{self.name} ({self.dtype} sha256:{self.sha256[:16]})"


def _peft() -> Any:
    try:
        import peft
    except ImportError as e:
        raise ConfigError("--lora.rank > 0 needs peft: pip install 'agentrl[lora]'") from e
    return peft


def base_record(model: Any, name: str, seed: int) -> BaseRecord:
    """The :class:`BaseRecord` of a plain (not yet adapted) model loaded by ``name``."""
    if is_adapted(model):
        raise ConfigError("base_record needs the base model before adapters are injected")
    state = model.state_dict()
    dtype = str(next(iter(model.parameters())).dtype).removeprefix("torch.")
    return BaseRecord(name, int(seed), dtype, weights_checksum(state))


def _is_lora_key(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def is_adapted(model: Any) -> bool:
    """Whether ``model`` has LoRA layers injected."""
    return any(_is_lora_key(n) for n, _ in model.named_parameters())


def adapter_state(model: Any) -> dict[str, torch.Tensor] | None:
    """The adapter's tensors of an adapted model under the model's own names
    (``model.layers.0.self_attn.q_proj.lora_A.default.weight``); None when it has no adapters."""
    state = {k: v for k, v in model.state_dict().items() if _is_lora_key(k)}
    return state or None


def published_state(model: Any) -> dict[str, torch.Tensor]:
    """What the learner hands its samplers after a step: the adapter alone when there is one (the base never
    changes), else every tensor."""
    state = adapter_state(model)
    return state if state is not None else dict(model.state_dict())


def adapter_digest(model_or_tensors: Any) -> str:
    """:func:`weights_checksum` of the adapter a model holds (or of adapter tensors by name)."""
    if isinstance(model_or_tensors, Mapping):
        state = {k: v for k, v in model_or_tensors.items() if _is_lora_key(k)}
    else:
        state = adapter_state(model_or_tensors) or {}
    if not state:
        raise ConfigError("adapter_digest: no LoRA adapter tensors there")
    return weights_checksum(state)


class Adapted:
    """A base model with peft LoRA adapters: :attr:`model` is the adapted Hugging Face model (what the learner
    and samplers use); this object saves and loads the adapter and merges it."""

    def __init__(self, peft_model: Any, base: BaseRecord, config: LoraConfig):
        self.peft_model = peft_model
        self.base = base
        self.config = config

    @property
    def model(self) -> Any:
        """The adapted model (the base model object, its linear layers wrapped by peft)."""
        return self.peft_model.get_base_model()

    def save_pretrained(self, path: str | os.PathLike[str], **kwargs: Any) -> None:
        """Write the adapter (peft's format) and its :class:`BaseRecord` to ``path`` (what
        :func:`agentrl.checkpoint.save_checkpoint` calls)."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.peft_model.save_pretrained(str(folder), safe_serialization=True)
        (folder / "README.md").unlink(missing_ok=True)  # peft's model-card stub says nothing about the run
        (folder / BASE_FILE).write_text(json.dumps(asdict(self.base)))

    def load_adapter(self, folder: str | os.PathLike[str]) -> None:
        """Load the adapter saved in ``folder`` into this model.

        Raises:
            StoreError: the folder is not an adapter, it was trained on another base (its weights checksum
                differs), or its rank or targets differ from this model's.
        """
        from safetensors.torch import load_file

        path = Path(folder)
        saved = read_base_record(path)
        if saved.dtype != self.base.dtype or saved.sha256 != self.base.sha256:
            raise StoreError(
                f"{path}: the adapter was trained on base {saved.describe()}, but this model's base is "
                f"{self.base.describe()}; an adapter only means something on the weights it was trained on"
            )
        files = sorted(path.glob("adapter_model*.safetensors"))
        if not files:
            raise StoreError(f"{path} holds no adapter_model.safetensors")
        tensors: dict[str, Any] = {}
        for f in files:
            tensors.update(load_file(str(f)))
        own = self.model
        own_dtype = next(iter(own.parameters())).dtype
        # Compacted (float16) checkpoints upcast to the model's dtype, as full checkpoints do.
        tensors = {k: v.to(own_dtype) if v.is_floating_point() else v for k, v in tensors.items()}
        peft = _peft()
        expected = set(peft.get_peft_model_state_dict(self.peft_model))
        if set(tensors) != expected:
            missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
            raise StoreError(
                f"{path}: the adapter does not fit this model's LoRA layers (--lora.rank/--lora.targets): "
                f"missing {missing[:3]}, unexpected {extra[:3]}"
            )
        result = peft.set_peft_model_state_dict(self.peft_model, tensors)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise StoreError(f"{path}: adapter tensors this model has no place for: {unexpected[:3]}")
        _check_shapes(self.peft_model, tensors, path)

    def merged(self) -> Any:
        """The base model with the adapter merged into its weights, as a plain Hugging Face model (this object
        is spent afterwards: the merge happens in place)."""
        return self.peft_model.merge_and_unload()


def _check_shapes(peft_model: Any, tensors: Mapping[str, Any], path: Path) -> None:
    peft = _peft()
    now = peft.get_peft_model_state_dict(peft_model)
    for k, v in tensors.items():
        if tuple(now[k].shape) != tuple(v.shape):
            raise StoreError(f"{path}: {k} has shape {tuple(v.shape)}, this model's is {tuple(now[k].shape)}")


def apply_lora(model: Any, config: LoraConfig, *, name: str, seed: int) -> Adapted:
    """Inject LoRA adapters into ``model`` (in place), freezing every base weight.

    ``name`` and ``seed`` say how the base was loaded (they go into the :class:`BaseRecord`); ``seed`` also
    seeds the adapters' initial values, so a run's step-0 adapter can be rebuilt exactly.

    Raises:
        ConfigError: LoRA is off in ``config``, peft is not installed, or no module matches the targets.
    """
    import torch

    if not config.enabled:
        raise ConfigError("apply_lora needs --lora.rank > 0")
    peft = _peft()
    base = base_record(model, name, seed)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)
        # peft asks the model whether gradient checkpointing is on through a name transformers 5 deprecates
        # (a FutureWarning we cannot act on; the project's tests turn warnings into errors).
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        try:
            peft_model = peft.get_peft_model(model, config.peft_config())
        except ValueError as e:  # peft: "Target modules ... not found in the base model"
            raise ConfigError(f"--lora.targets {list(config.targets)}: {e}") from e
    return Adapted(peft_model, base, config)


def is_adapter_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds an adapter written by agentrl (peft files and a :class:`BaseRecord`)."""
    p = Path(path)
    return (p / ADAPTER_CONFIG).is_file() and (p / BASE_FILE).is_file()


def read_base_record(folder: str | os.PathLike[str]) -> BaseRecord:
    """The :class:`BaseRecord` saved in an adapter folder."""
    path = Path(folder) / BASE_FILE
    try:
        raw = json.loads(path.read_text())
        return BaseRecord(str(raw["name"]), int(raw["seed"]), str(raw["dtype"]), str(raw["sha256"]))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise StoreError(f"{path} is not a readable base record: {e}") from e


def saved_config(folder: str | os.PathLike[str]) -> LoraConfig:
    """The :class:`LoraConfig` an adapter folder was trained with (from peft's ``adapter_config.json``)."""
    path = Path(folder) / ADAPTER_CONFIG
    try:
        raw = json.loads(path.read_text())
        targets = raw["target_modules"]
        t = (targets,) if isinstance(targets, str) else tuple(sorted(targets))
        return LoraConfig(int(raw["r"]), float(raw["lora_alpha"]), float(raw["lora_dropout"] or 0.0), t)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise StoreError(f"{path} is not a readable adapter config: {e}") from e


def load_adapted(folder: str | os.PathLike[str], base_model: Any) -> Adapted:
    """The adapter saved in ``folder`` on ``base_model``: the base its record names, loaded in the record's
    dtype (:func:`agentrl.models.load_adapter_folder` loads it). The base is checked against the record before
    anything else, so an adapter never silently lands on other weights.

    Raises:
        StoreError: the base's weights are not the ones the adapter was trained on.
    """
    base = read_base_record(folder)
    adapted = apply_lora(base_model, saved_config(folder), name=base.name, seed=base.seed)
    if adapted.base.sha256 != base.sha256:
        raise StoreError(
            f"{folder}: the adapter was trained on base {base.describe()}, but {base.name!r} now loads "
            f"{adapted.base.describe()}"
        )
    adapted.load_adapter(folder)
    return adapted
