"""Fixtures for the environment tests: the real local sandbox, when this machine can run it."""

from __future__ import annotations

import pytest

from agentrl._sync import run_sync


async def _probe(cls: type) -> str:
    async with cls() as sb:
        result = await sb.run("print(6 * 7)")
    return result.stdout.strip() if result.ok else f"{result.status}: {result.message or result.stderr}"


@pytest.fixture(scope="session")
def local_sandbox_cls() -> type:
    """``agentrl.sandbox.LocalSandbox``; the test is skipped (with the reason) where it cannot run."""
    try:
        from agentrl.sandbox import LocalSandbox
    except ImportError as e:
        pytest.skip(f"agentrl.sandbox.LocalSandbox is not importable: {e}")
    try:
        out = run_sync(_probe(LocalSandbox))
    except Exception as e:
        pytest.skip(f"LocalSandbox cannot start on this machine: {e!r}")
    if out != "42":
        pytest.skip(f"LocalSandbox does not run code on this machine: {out}")
    return LocalSandbox
