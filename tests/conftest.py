"""Shared test set-up: a real Prometheus and a real Kubernetes control plane on demand, and no test
may leave a task running."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import settings

from batchd.testing.kubernetes.logs import check_watched

# Property tests run the same examples every run (a test that fails one run in ten would block
# every landing) and keep no database in the checkout; `HYPOTHESIS_PROFILE=explore` draws new ones.
settings.register_profile("batchd", derandomize=True, database=None)
settings.register_profile("explore", database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "batchd"))

# `start_prometheus`; `control_plane` (a real Kubernetes control plane) and `kube_namespace`.
pytest_plugins = ["batchd.testing.prometheus", "batchd.testing.kubernetes.fixtures"]

# Tests that hold a load on real processes for tens of seconds and assert how the system follows it
# (autoscaling, the operator under faults, the benchmarks' smoke runs). `make test` runs them one
# after another on one worker (pytest-xdist's loadgroup), never beside each other: each then shares
# the machine with at most one lighter test, as the tests were tuned for.
SUSTAINED_LOAD = frozenset(
    {
        "tests/e2e/test_autoscaling.py",
        "tests/operator/test_chaos.py",
        "tests/bench/autoscaling/test_autoscaling.py",
        "tests/bench/adaptive/test_adaptive.py",
    }
)


SHARED_SCOPES = frozenset({"module", "package", "class"})


def _shares_a_fixture_with_its_module(item: pytest.Item) -> bool:
    """Whether the test uses a fixture set up once for its module (a replica process, a model)."""
    # pytest keeps a test's fixture definitions on `_fixtureinfo`, as plugins read it.
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    return any(definition.scope in SHARED_SCOPES for chain in definitions for definition in chain)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.relative_to(config.rootpath).as_posix()
        if module in SUSTAINED_LOAD:
            item.add_marker(pytest.mark.xdist_group("sustained-load"))
        elif _shares_a_fixture_with_its_module(item) and not item.get_closest_marker("xdist_group"):
            # One worker runs the module, so its shared fixture starts once, not once per worker.
            item.add_marker(pytest.mark.xdist_group(module))


# How long a test's tasks that are already finishing (cancelled, closing) may take to finish; a
# task that is not finishing fails the test after it either way, so a busy machine costs no flake.
FINISHING_S = 5.0


@pytest.fixture(autouse=True)
def clean_component_logs() -> Iterator[None]:
    """Fail a test during which the operator or the router (as processes, or the chart's pods)
    logged a traceback or an RBAC refusal."""
    yield
    found = check_watched()
    if found:
        pytest.fail("the operator's or the router's log shows:\n" + "\n".join(found), pytrace=False)


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
