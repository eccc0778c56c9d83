"""Model composition end to end on the real cluster: the operator wires a composer's handles to its
callee through the router, and the composer's calls reach the callee by the router's Service name
(CoreDNS, kube-proxy) and are batched there.

The chart's operator and router run in pods from our images; the test handlers come from a mounted
ConfigMap (`batchd.testing.kubernetes.handlers`).
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator

import httpx
import pytest

from batchd.api.pod import REPLICA_METRICS_PORT, REPLICA_PORT, selector_string
from batchd.testing import manifests
from batchd.testing.kubernetes import handlers
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import ONE_ROUTER, Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.promtext import parse_histogram

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def release(
    control_plane: ControlPlane, kube_node: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    with installed(control_plane, tmp_path_factory.mktemp("composition"), ONE_ROUTER, wait=True) as release:
        release.apply(handlers.config_map())
        yield release


def pod_url(release: Release, name: str, port: int = REPLICA_PORT) -> str:
    listed = release.cluster.kubectl(
        "get", "pods", "-n", release.namespace, "-l", selector_string(name), "-o", "json"
    ).stdout
    (pod,) = json.loads(listed)["items"]
    return f"http://{pod['status']['podIP']}:{port}"


def test_a_composers_calls_reach_its_callee_through_the_router_and_are_batched_there(
    release: Release,
) -> None:
    cluster, ns = release.cluster, release.namespace
    callee = manifests.doubler("doubler", batch_wait_timeout_s=0.05)
    composer = manifest(
        "relay",
        {"handler": "batchd.testing.batch_handlers:Relay", "calls": {"double": "doubler"}},
        batching={"max_batch_size": 1, "max_concurrent_batches": 32},
    )
    for document in (composer, callee):  # the composer first: a name resolves before its Service exists
        document["spec"].update(handlers.pod_spec())
        release.apply(document)
    for name in ("relay", "doubler"):
        cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", f"bd/{name}", "--timeout=180s")
    # The operator told the composer where its callee is: the router's Service, by name ...
    deployment = release.get("deployment", "relay")
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    router = f"http://{release.name}-router.{ns}.svc"
    assert json.loads(env["BATCHD_CALLS"]) == {"double": f"{router}/deployments/{ns}/doubler"}
    # ... and the composer's requests, each calling the callee once, are batched by the callee.
    url = f"{pod_url(release, 'relay')}/v1/models/relay:predict"
    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=48)) as client:
        with concurrent.futures.ThreadPoolExecutor(48) as pool:
            answers = list(
                pool.map(
                    lambda n: client.post(url, json={"instances": [{"to": "double", "n": n}]}), range(48)
                )
            )
        metrics = client.get(f"{pod_url(release, 'doubler', REPLICA_METRICS_PORT)}/metrics").text
    assert [answer.status_code for answer in answers] == [200] * 48, answers[0].text
    assert [answer.json()["predictions"] for answer in answers] == [[2 * n] for n in range(48)]
    batches = parse_histogram(metrics, "batchd_batch_size")
    assert batches.sum >= 48 and batches.mean > 2, batches.distribution()
