"""Faults only a real control plane shows: the API server restarted under load, with etcd's history
compacted meanwhile so that every watch that comes back is told 410 Gone and must list again.
(Replicas and routers killed under load: `test_router.py`.)

Replicas run as pods on the node; the operator and the router run on the chart's ServiceAccount
tokens. Clients must not notice, and both must follow what changes afterwards.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.servers import free_port
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow
LOAD_LIMIT_S = 120.0
NO_ANSWER, WRONG_ANSWER = 0, -1


@pytest.fixture(scope="module")
def release(
    control_plane: ControlPlane, kube_node: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    with installed(control_plane, tmp_path_factory.mktemp("faults")) as release:
        yield release


def lists(release: Release) -> dict[str, int]:
    """How many LISTs the router made of EndpointSlices, and the operator of BatchedDeployments."""

    def count(user: str, resource: str) -> int:
        return sum(
            1
            for event in release.cluster.audit_events(user)
            if event["verb"] == "list" and event.get("objectRef", {}).get("resource") == resource
        )

    return {
        "router": count(release.router_user, "endpointslices"),
        "operator": count(release.operator_user, "batcheddeployments"),
    }


class Load:
    """Requests one after another through the router until stopped (or LOAD_LIMIT_S), counted by
    their answer's status (or NO_ANSWER, WRONG_ANSWER)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.outcomes: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + LOAD_LIMIT_S
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    answer = client.post(self.url, json={"instances": [1, 2]})
                except httpx.TransportError:
                    self.outcomes[NO_ANSWER] += 1
                    continue
                wrong = answer.status_code == 200 and answer.json() != {"predictions": [2, 3]}
                self.outcomes[WRONG_ANSWER if wrong else answer.status_code] += 1

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def test_an_api_server_restart_with_410_gone_is_invisible_to_clients(
    release: Release, tmp_path: Path
) -> None:
    cluster, ns = release.cluster, release.namespace

    def apply(name: str) -> None:
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest(name)))

    router_port = free_port()
    router = f"http://127.0.0.1:{router_port}"
    with (
        release.operator(tmp_path / "operator.log"),
        release.router(tmp_path / "router.log", router_port),
    ):
        apply("before")
        cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "bd/before", "--timeout=180s")
        predict = f"{router}/v1/models/before:predict"
        eventually(
            lambda: httpx.post(predict, json={"instances": [1]}).status_code == 200,
            what="the router to route to the replica",
        )
        with Load(predict) as load:
            eventually(lambda: load.outcomes[200] >= 20, what="load before the restart")
            lists_before = lists(release)
            away_s = cluster.restart_apiserver(compact=True)
            served_during = load.outcomes[200]
            eventually(lambda: load.outcomes[200] >= served_during + 20, what="load after the restart")
        assert set(load.outcomes) == {200}, load.outcomes
        assert away_s > 0
        # Both follow what changes after the restart: the operator makes the new deployment's
        # children, the router learns its replicas (each watch was answered 410 Gone, and relisted).
        apply("after")
        cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "bd/after", "--timeout=180s")
        answer = eventually(
            lambda: (
                (r := httpx.post(f"{router}/v1/models/after:predict", json={"instances": [5]})).is_success
                and r
            ),
            what="the router to route to the deployment made after the restart",
        )
        assert answer.json() == {"predictions": [6]}
    # Each listed again: a watch resumed from its resourceVersion would not have.
    lists_after = lists(release)
    assert (
        lists_after["router"] > lists_before["router"] and lists_after["operator"] > lists_before["operator"]
    )
