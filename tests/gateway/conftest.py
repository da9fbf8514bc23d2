"""Gateway tests: close the openai clients a test made, in the test's own event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from .helpers import OPEN_CLIENTS


@pytest_asyncio.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while OPEN_CLIENTS:
        await OPEN_CLIENTS.pop().close()
