"""``agentrl.sandbox.release_cgroups``: a host about to be killed outright (a Ray rollout worker stopped with
``ray.kill``, which skips ``atexit``) removes its sandbox cgroups first, and the empty ones dead agentrl
processes left beside them; a sandbox started afterwards gets fresh ones."""

import pytest

from agentrl.sandbox import LocalSandbox, _cgroup, release_cgroups

from .conftest import requires_bwrap


@requires_bwrap
async def test_release_removes_own_and_dead_cgroups_and_a_later_sandbox_probes_again():
    async with LocalSandbox() as sb:
        assert (await sb.run("print(1)")).stdout.strip() == "1"
    m = _cgroup.manager()
    if not m.available:
        pytest.skip(f"no per-sandbox cgroups here: {m.reason}")
    own = list(m.parents.values())
    dead = [p.parent / "agentrl-999999999" for p in own]  # above pid_max: no live process has this pid
    for d in dead:
        d.mkdir(exist_ok=True)
    assert all(p.is_dir() for p in own)
    release_cgroups()
    assert not any(p.exists() for p in [*own, *dead])
    async with LocalSandbox() as sb:
        assert (await sb.run("print(2)")).stdout.strip() == "2"
    assert m.available and all(p.is_dir() for p in m.parents.values())
