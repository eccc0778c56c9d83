"""batchd on a real node: the chart installed with `helm install --wait`, its operator and routers
running in pods from the images built from our Dockerfile, and a BatchedDeployment applied with
`kubectl` answering through its Service's ClusterIP and through the router, as a user would use it;
and `kubectl drain` of the node onto a second one, which the deployment's disruption budget lets
take one replica at a time, losing no request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from batchd.api.pod import selector_string
from batchd.testing import ROOT
from batchd.testing.closed_loop import SteadyLoad
from batchd.testing.kubernetes.components import forbidden
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.policies import enforced
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
    router = release.router_url()
    routed = eventually(
        lambda: (
            (r := httpx.post(f"{router}/v1/models/adder:predict", json=body, timeout=10)).is_success and r
        ),
        what="the router to route to the adder",
    )
    assert routed.json() == {"predictions": [2, 3, 4]}


def test_a_drain_moves_the_replicas_to_another_node_losing_no_request(
    release: Release, kube_node: Node, second_kube_node: Node
) -> None:
    cluster, ns = release.cluster, release.namespace

    def nodes() -> set[str]:
        return {pod["spec"].get("nodeName", "") for pod in release.pods("moved", ready=True)}

    # Both replicas on the first node: the second takes pods only once the drain begins.
    cluster.kubectl("cordon", second_kube_node.name)
    release.apply(manifest("moved", num_replicas=2))
    cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "bd/moved", "--timeout=180s")
    assert nodes() == {kube_node.name}
    predict = f"{release.service_url('moved', 8000)}/v1/models/moved:predict"
    release.first_answer(predict, {"instances": [1]})
    cluster.kubectl("uncordon", second_kube_node.name)
    try:
        with SteadyLoad(predict) as load:
            eventually(lambda: load.outcomes[200] >= 20, what="load before the drain")
            # The budget lets one replica go at a time: the next eviction waits until the first
            # one's replacement is Ready on the other node (kubectl retries it every 5 s).
            drain = cluster.kubectl(
                "drain",
                kube_node.name,
                f"--pod-selector={selector_string('moved')}",
                "--delete-emptydir-data",
                "--timeout=150s",
                timeout_s=180,
            )
            eventually(
                lambda: nodes() == {second_kube_node.name} and len(release.pods("moved")) == 2,
                timeout_s=60,
                what="both replicas Ready on the second node",
            )
            served = load.outcomes[200]
            eventually(lambda: load.outcomes[200] >= served + 20, what="load after the drain")
    finally:
        cluster.kubectl("uncordon", kube_node.name)
    # kubectl asked for both evictions at once; the budget refused the second until the first
    # one's replacement was Ready.
    assert "violate the pod's disruption budget" in drain.stderr, drain.stderr
    # Every request answered, by a replica on one node or the other: each evicted one drained.
    assert set(load.outcomes) == {200}, load.outcomes
    cluster.kubectl("delete", "-n", ns, "bd/moved", "--wait=true", timeout_s=120)


def test_a_network_policy_is_enforced_on_the_node_while_its_enforcer_runs(
    release: Release, kube_node: Node
) -> None:
    """The test part the access tests rely on: kube-router's policy controller makes a node drop
    what a NetworkPolicy does not allow, and leaves the node as it was when it stops."""
    cluster, ns = release.cluster, release.namespace
    release.apply(manifest("fenced"))
    cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "bd/fenced", "--timeout=180s")
    (pod,) = release.pods("fenced", ready=True)
    predict = f"http://{pod['status']['podIP']}:8000/v1/models/fenced:predict"

    def answered() -> bool:
        try:
            return httpx.post(predict, json={"instances": [1]}, timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    deny_all = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "fenced-deny-all"},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/instance": "fenced"}},
            "policyTypes": ["Ingress"],
        },
    }
    release.apply(deny_all)
    try:
        assert answered()  # a policy alone changes nothing on a node that does not enforce it
        with enforced(kube_node):
            eventually(lambda: not answered(), timeout_s=30, what="the node to drop the traffic")
            assert kube_node.ready()
        eventually(answered, timeout_s=30, what="the traffic to flow again once the enforcer stopped")
    finally:
        cluster.kubectl("delete", "-n", ns, "networkpolicy/fenced-deny-all", "--ignore-not-found")
        cluster.kubectl("delete", "-n", ns, "bd/fenced", "--wait=false")
