"""batchd on a real node: the chart installed with `helm install --wait`, its operator and routers
running in pods from the images built from our Dockerfile, and a BatchedDeployment applied with
`kubectl` answering through its Service's ClusterIP and through the router, as a user would use it;
and `kubectl drain` of the node, which the deployment's disruption budget lets take one replica at
a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from batchd.operator import children
from batchd.testing import ROOT
from batchd.testing.kubernetes.components import forbidden
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import ONE_ROUTER, Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def release(
    control_plane: ControlPlane, kube_node: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    with installed(control_plane, tmp_path_factory.mktemp("node"), ONE_ROUTER, wait=True) as release:
        yield release


def test_the_operator_and_router_run_in_pods_under_restricted(release: Release) -> None:
    pods = json.loads(release.cluster.kubectl("get", "pods", "-n", release.namespace, "-o", "json").stdout)[
        "items"
    ]
    running = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p["status"]["phase"] for p in pods}
    assert running == {"operator": "Running", "router": "Running"}
    assert forbidden(release.cluster, release.operator_user) == []
    assert forbidden(release.cluster, release.router_user) == []


def test_an_applied_deployment_answers_through_its_service_and_the_router(release: Release) -> None:
    cluster, ns = release.cluster, release.namespace
    cluster.kubectl("apply", "-n", ns, "-f", str(ROOT / "examples" / "adder.yaml"))
    cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "bd/adder", "--timeout=180s")
    body = {"instances": [1, 2, 3]}
    answer = release.first_answer(f"{release.service_url('adder', 8000)}/v1/models/adder:predict", body)
    assert answer.json() == {"predictions": [2, 3, 4]}
    router = release.service_url(f"{release.name}-router", 80)
    routed = eventually(
        lambda: (
            (r := httpx.post(f"{router}/v1/models/adder:predict", json=body, timeout=10)).is_success and r
        ),
        what="the router to route to the adder",
    )
    assert routed.json() == {"predictions": [2, 3, 4]}


def test_a_drain_takes_one_replica_at_a_time(release: Release, kube_node: Node) -> None:
    cluster, ns = release.cluster, release.namespace
    release.apply(manifest("drained", num_replicas=2))
    cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "bd/drained", "--timeout=180s")
    selector = children.selector_string("drained")

    def budget_allows() -> int:
        budget = release.get("poddisruptionbudget", "drained")
        return int(((budget or {}).get("status") or {}).get("disruptionsAllowed", 0))

    # The disruption controller counts both replicas healthy: one may go.
    eventually(lambda: budget_allows() == 1, what="the replicas' budget to allow one disruption")
    before = {pod["metadata"]["name"] for pod in release.pods("drained")}
    try:
        drain = cluster.kubectl(
            "drain",
            kube_node.name,
            f"--pod-selector={selector}",
            "--delete-emptydir-data",  # a replica's emptyDir volumes are scratch
            "--timeout=10s",  # it retries a refused eviction every 5 s until then
            check=False,
            timeout_s=90,
        )
        # One replica evicted; the other refused while the first one's replacement is not Ready
        # (here it cannot be: the node is cordoned and the only one).
        assert drain.returncode != 0, drain.stdout
        assert "violate the pod's disruption budget" in drain.stderr, drain.stderr
        left = {pod["metadata"]["name"] for pod in release.pods("drained", ready=True)}
        assert len(left) == 1 and left < before, (before, left)
        answer = httpx.post(
            f"{release.service_url('drained', 8000)}/v1/models/drained:predict",
            json={"instances": [1]},
            timeout=10,
        )
        assert answer.json() == {"predictions": [2]}
    finally:
        cluster.kubectl("uncordon", kube_node.name)
    eventually(lambda: len(release.pods("drained", ready=True)) == 2, timeout_s=120, what="2 replicas back")
