"""Faults only a real control plane shows: the API server restarted under load, with etcd's history
compacted meanwhile so that every watch that comes back is told 410 Gone and must list again.
(Replicas and routers killed under load: `test_router.py`.)

Replicas run as pods on the node; the operator and the router run on the chart's ServiceAccount
tokens. Clients must not notice, and both must follow what changes afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from batchd.testing.closed_loop import SteadyLoad
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.servers import free_port
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow


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


def test_an_api_server_restart_with_410_gone_is_invisible_to_clients(
    release: Release, tmp_path: Path
) -> None:
    cluster, ns = release.cluster, release.namespace

    def apply(name: str) -> None:
        release.apply(manifest(name))

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
        with SteadyLoad(predict) as load:
            eventually(lambda: load.outcomes[200] >= 20, what="load before the restart")
            lists_before = lists(release)
            away_s = cluster.restart_apiserver(compact=True)
            served_during = load.outcomes[200]
            eventually(lambda: load.outcomes[200] >= served_during + 20, what="load after the restart")
        assert set(load.outcomes) == {200}, load.outcomes
        # A restarted API server refuses requests until its authorizer has read the RBAC rules
        # again: the components log those refusals and retry. Nothing else may show.
        logged = release.component_logs.new_problems()
        assert all("is forbidden" in problem and "Traceback" not in problem for problem in logged), logged
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
