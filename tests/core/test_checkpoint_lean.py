"""Lean checkpoints: only the newest keeps optimizer state; older ones keep float16 weights for replay."""

import json
import shutil

import pytest
import torch

from agentrl.checkpoint import (
    CheckpointState,
    compact_checkpoint,
    describe_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from agentrl.errors import ConfigError, StoreError
from agentrl.models import load_model, tiny_model
from agentrl.run import RunDir


def trained(tok, seed=0):
    """A tiny model over SmolLM2's tokenizer with AdamW state after one real step."""
    model = tiny_model(tok, seed=seed, hidden=32, layers=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.tensor([[1, 2, 3, 4]])
    model(ids, labels=ids).loss.backward()
    opt.step()
    return model, opt


def save(run, model, opt, step, **kw):
    return save_checkpoint(run, model=model, optimizer=opt, state=CheckpointState(step, step, {}), **kw)


def size(path):
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_only_the_newest_keeps_optimizer_state_and_older_ones_are_half(tmp_path, tok):
    run = RunDir(tmp_path)
    model, opt = trained(tok)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    for step in (1, 2, 3, 4):
        save(run, model, opt, step, keep=3, older="half")
    assert run.checkpoint_steps() == (2, 3, 4)
    newest, older = run.checkpoint(4), [run.checkpoint(2), run.checkpoint(3)]
    assert (newest.path / "optimizer.pt").is_file()
    full = describe_checkpoint(newest)
    assert (full.weights_dtype, full.exact, full.optimizer) == ("float32", True, True)
    for c in older:
        d = describe_checkpoint(c)
        assert not (c.path / "optimizer.pt").exists() and (c.path / "rng.pt").is_file()
        assert (d.weights_dtype, d.trained_dtype) == ("float16", "float32")
        assert not d.exact and not d.optimizer
        assert d.describe() == "float16 copy of float32 weights, no optimizer state"
        assert json.loads(c.state_path.read_text())["step"] == c.step  # old readers' keys are unchanged
        # The weights file halves; the optimizer state (two float32 moments per weight) is gone.
        w_old = (c.model_dir / "model.safetensors").stat().st_size
        w_new = (newest.model_dir / "model.safetensors").stat().st_size
        assert w_old < 0.51 * w_new
        assert size(c.path) < 0.2 * size(newest.path)
    # Replay loads an older one into a float32 model: each weight within float16's rounding of the trained.
    other = tiny_model(tok, seed=7, hidden=32, layers=1)
    assert load_checkpoint(older[0], model=other, restore_rng=False).step == 2
    for k, v in other.state_dict().items():
        assert v.dtype == torch.float32
        assert torch.equal(v, weights[k].to(torch.float16).float()), k
        assert torch.allclose(v, weights[k], rtol=2**-11, atol=2**-24), k
    # ...and so does a plain Hugging Face load (what readers from before compaction do).
    hf = load_model(older[0].model_dir, dtype="float32")
    assert next(hf.parameters()).dtype == torch.float32
    # Resuming needs the optimizer state: a clear error, not a FileNotFoundError.
    _, fresh_opt = trained(tok, seed=1)
    with pytest.raises(StoreError, match=r"step-000002 has no optimizer state.*only a run's newest"):
        load_checkpoint(older[0], model=other, optimizer=fresh_opt)
    # The newest resumes exactly.
    _, opt2 = trained(tok, seed=1)
    load_checkpoint(newest, model=other, optimizer=opt2, restore_rng=False)
    for k, v in other.state_dict().items():
        assert torch.equal(v, weights[k])


def test_exact_and_whole_keep_what_they_say(tmp_path, tok):
    model, opt = trained(tok)
    cases = ((None, False, "float32"), ("exact", False, "float32"), ("whole", True, "float32"))
    for older, has_opt, dtype in cases:
        run = RunDir(tmp_path / str(older))
        for step in (1, 2):  # None: the default, exact
            save(run, model, opt, step, keep=3, **({} if older is None else {"older": older}))
        assert describe_checkpoint(run.checkpoint(2)).optimizer
        d = describe_checkpoint(run.checkpoint(1))
        assert (d.optimizer, d.weights_dtype, d.exact) == (has_opt, dtype, True), older
    with pytest.raises(ConfigError, match="older must be"):
        save(RunDir(tmp_path / "bad"), model, opt, 1, older="fp8")


def test_compaction_is_idempotent_and_keeps_tensors_float16_cannot_hold(tmp_path, tok):
    run = RunDir(tmp_path)
    model, opt = trained(tok)
    with torch.no_grad():
        model.model.norm.weight[0] = 1e6  # beyond float16's range (65504): must not become inf
    save(run, model, opt, 1)
    c = run.checkpoint(1)
    first = compact_checkpoint(c)
    again = compact_checkpoint(c)  # e.g. after a crash half-way through the first one
    assert first == again and first.weights_dtype == "float16+float32" and first.trained_dtype == "float32"
    other = tiny_model(tok, seed=3, hidden=32, layers=1)
    load_checkpoint(c, model=other, restore_rng=False)
    assert other.model.norm.weight[0].item() == 1e6
    assert all(torch.isfinite(v).all() for v in other.state_dict().values())


def test_checkpoints_from_before_compaction_load_and_get_compacted(tmp_path, tok):
    """An old run's checkpoints (optimizer state in each, no "compact" entry) resume and replay as before;
    the next save by this release compacts them."""
    run = RunDir(tmp_path)
    model, opt = trained(tok)
    for step in (1, 2):
        save(run, model, opt, step, older="whole")
    for c in run.checkpoints():  # exactly what the old writer left: state.json with three keys
        meta = json.loads(c.state_path.read_text())
        assert set(meta) == {"step", "policy_version", "extra"}
        assert describe_checkpoint(c).optimizer and describe_checkpoint(c).exact
    other, other_opt = trained(tok, seed=1)
    assert load_checkpoint(run.checkpoint(1), model=other, optimizer=other_opt, restore_rng=False).step == 1
    old_copy = tmp_path.parent / f"{tmp_path.name}-copy"
    shutil.copytree(run.path, old_copy)
    save(run, model, opt, 3, keep=3)
    assert [describe_checkpoint(c).optimizer for c in run.checkpoints()] == [False, False, True]
    assert all(describe_checkpoint(c).exact for c in run.checkpoints())
    assert describe_checkpoint(RunDir(old_copy).checkpoint(1)).optimizer  # the copy was left alone
