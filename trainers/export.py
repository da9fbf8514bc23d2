"""``agentrl export RUN --merged DIR``: a run's trained policy as a plain Hugging Face model folder.

A LoRA run's checkpoints hold only the adapter (:mod:`agentrl.lora`); export loads the base it records
(checked against the base's weights checksum), merges the adapter into the base's weights and writes the
merged model with its tokenizer, a folder that ``transformers`` (``AutoModelForCausalLM.from_pretrained``) and
``vllm serve`` load without peft. A full fine-tuning run's checkpoint is written out as it is. ``--step K``
picks the checkpoint after K steps (default: the newest).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.run import RunDir

__all__ = ["add_parser", "export_merged", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to ``agentrl``'s subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "export",
        help="write a run's trained policy as a Hugging Face model folder (LoRA adapters merged)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", help="run directory (or one of its checkpoints/step-N)")
    p.add_argument("--merged", required=True, metavar="DIR", help="folder to write (must not hold files)")
    p.add_argument(
        "--step", type=int, default=None, help="the checkpoint after this many steps (default newest)"
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="dtype of the written weights (default: the checkpoint's)",
    )
    return p


def _checkpoint_folder(run: str | os.PathLike[str], step: int | None) -> Path:
    p = Path(run)
    if (p / "model").is_dir() and step is None:  # a checkpoint folder itself
        return p
    rd = RunDir(p)
    if not rd.exists():
        raise ConfigError(f"{p} is not a run directory (no config.json) or a checkpoint folder")
    ckpt = rd.latest_checkpoint() if step is None else rd.find_checkpoint(step)
    if ckpt is None:
        have = list(rd.checkpoint_steps())
        raise ConfigError(
            f"{p} has no checkpoint {'yet' if step is None else f'of step {step}'} (on disk: {have})"
        )
    return ckpt.path


def export_merged(
    run: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    step: int | None = None,
    dtype: str | None = None,
) -> Path:
    """Write the policy of ``run``'s checkpoint (newest, or after ``step`` steps) to ``out`` as a Hugging Face
    folder, LoRA adapters merged into the base; returns ``out``."""
    import torch

    from agentrl.lora import is_adapter_folder, read_base_record
    from agentrl.models import load_adapter_folder, load_model, resolve_tokenizer

    dest = Path(out)
    if dest.exists() and any(dest.iterdir()):
        raise ConfigError(f"--merged {dest}: the folder holds files already; give a new or empty one")
    ckpt = _checkpoint_folder(run, step)
    model_dir = ckpt / "model"
    if is_adapter_folder(model_dir):
        base = read_base_record(model_dir)
        adapted = load_adapter_folder(model_dir, device="cpu", dtype=base.dtype)
        model: Any = adapted.merged()
        note = {"merged_from": str(model_dir), "base": base.describe(), "lora_rank": adapted.config.rank}
    else:
        model = load_model(model_dir)
        note = {"copied_from": str(model_dir)}
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dest), safe_serialization=True)
    resolve_tokenizer(str(model_dir)).save_pretrained(str(dest))
    (dest / "agentrl_export.json").write_text(json.dumps(note))
    return dest


def run(ns: argparse.Namespace) -> int:
    """Run ``agentrl export``: it says which checkpoint it wrote out, and how (merged or copied)."""
    dest = export_merged(ns.run, ns.merged, step=ns.step, dtype=ns.dtype)
    print(describe_export(dest))
    print(f"wrote {dest} (load it with transformers.AutoModelForCausalLM.from_pretrained or vllm serve)")
    return 0


def describe_export(dest: Path) -> str:
    """What :func:`export_merged` wrote into ``dest``, from its ``agentrl_export.json``: the checkpoint (its
    step), and the base a LoRA adapter was merged into."""
    from agentrl.run import checkpoint_step

    note = json.loads((dest / "agentrl_export.json").read_text())
    source = Path(note.get("merged_from") or note["copied_from"]).parent
    step = checkpoint_step(source.name)
    which = f"checkpoint {source}" + (f" (after {step} steps)" if step is not None else "")
    if "merged_from" in note:
        return f"merged the LoRA adapter (rank {note['lora_rank']}) of {which} into its base {note['base']}"
    return f"copied the weights of {which}"
