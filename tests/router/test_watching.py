"""The watches: a list, then changes; a watch that ends or expires lists again, forgetting what
was deleted while no watch was open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from batchd.api.kube_connection import ApiError
from batchd.api.pod import SERVICE_NAME_LABEL, SLICE_SELECTOR, labels
from batchd.router.access import Keyring
from batchd.router.directory import DeploymentRef, Directory
from batchd.router.watching import Watcher, watched_kinds


def endpoint_slice(name: str, service: str, address: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {**labels(service), SERVICE_NAME_LABEL: service},
        },
        "ports": [{"name": "http", "port": 8000}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
    }


class Script:
    """A stand-in API: each (list, watch events, how the watch ends) in turn, then nothing more."""

    def __init__(
        self, rounds: list[tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]], Exception]]
    ):
        self.rounds = rounds
        self.calls: list[tuple[str, str, str]] = []
        self.finished = asyncio.Event()

    async def list(self, path: str, label_selector: str) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(("list", path, label_selector))
        if not self.rounds:
            self.finished.set()
            await asyncio.Event().wait()  # the stand-in has nothing more to say
        return self.rounds[0][0], str(len(self.calls))

    async def watch(
        self, path: str, label_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.calls.append(("watch", path, resource_version))
        _, events, end = self.rounds.pop(0)
        for event in events:
            yield event
        raise end


async def test_changes_apply_and_a_relist_after_an_expired_watch_forgets_what_went() -> None:
    directory = Directory()
    ref = DeploymentRef("default", "adder")
    script = Script(
        [
            (
                [endpoint_slice("s1", "adder", "10.0.0.1")],
                [("ADDED", endpoint_slice("s2", "adder", "10.0.0.2")), ("BOOKMARK", {})],
                ApiError(410, "too old resource version"),
            ),
            ([endpoint_slice("s2", "adder", "10.0.0.2")], [], ApiError(500, "the API server went away")),
        ]
    )
    _, slices, _ = watched_kinds(directory, Keyring())
    watcher = Watcher(script, slices, "default", timeout_s=300, retry_s=0.01)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(script.finished.wait(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert watcher.synced.is_set()
    # s1 was deleted while no watch was open: the second list does not hold it.
    assert directory.replicas(ref) == ("10.0.0.2:8000",)
    path = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
    assert script.calls == [
        ("list", path, SLICE_SELECTOR),
        ("watch", path, "1"),
        ("list", path, SLICE_SELECTOR),
        ("watch", path, "3"),
        ("list", path, SLICE_SELECTOR),
    ]
