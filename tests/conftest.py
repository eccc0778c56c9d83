"""Shared test set-up: a real Prometheus on demand, and no test may leave a task running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

pytest_plugins = ["batchd.testing.prometheus"]  # the `start_prometheus` fixture


@pytest.fixture(autouse=True)
async def no_leaked_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fail a test that returns while tasks it started on its event loop are still pending."""
    before = asyncio.all_tasks()
    yield
    for _ in range(10):  # let tasks that are already finishing (cancelled, closing) finish
        leaked = asyncio.all_tasks() - before - {asyncio.current_task()}
        if not leaked:
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"{request.node.nodeid} left {len(leaked)} task(s) pending: {sorted(map(repr, leaked))[:5]}")
