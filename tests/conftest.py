"""Shared test set-up: a real Prometheus on demand, and no test may leave a task running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

pytest_plugins = ["batchd.testing.prometheus"]  # the `start_prometheus` fixture

# How long a test's tasks that are already finishing (cancelled, closing) may take to finish; a
# task that is not finishing fails the test after it either way, so a busy machine costs no flake.
FINISHING_S = 5.0


@pytest.fixture(autouse=True)
async def no_leaked_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fail a test that returns while tasks it started on its event loop are still pending."""
    before = asyncio.all_tasks()
    yield
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FINISHING_S
    while (leaked := asyncio.all_tasks() - before - {asyncio.current_task()}) and loop.time() < deadline:
        await asyncio.sleep(0.01)  # let tasks that are already finishing (cancelled, closing) finish
    if not leaked:
        return
    pytest.fail(f"{request.node.nodeid} left {len(leaked)} task(s) pending: {sorted(map(repr, leaked))[:5]}")
