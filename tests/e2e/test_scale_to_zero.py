"""Scale to zero and back on a real cluster: an idle deployment goes to zero replicas, and the next
request, sent to the chart's router Service as a client sends it, is held while the operator
starts a replica, then answered.

The router runs as the chart's pod; the operator as a process on the chart's ServiceAccount, with
polls a test can wait for (the chart's defaults are seconds apart).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import ONE_ROUTER, Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow

DELAY_S = 2  # scale_to_zero_delay_s
OPERATOR_ENV = {
    "BATCHD_REPLICA_POLL_INTERVAL_S": "0.25",
    "BATCHD_AUTOSCALING_STATUS_INTERVAL_S": "0.25",
    "BATCHD_WAKE_POLL_INTERVAL_S": "0.25",
    "BATCHD_DRAIN_DELAY_S": "1",
}
# A replica's start on a test node that shares two cores with the rest of the suite can take
# longer than the chart's 30 s hold, which is sized for a warm GPU node.
VALUES = {"router": {**ONE_ROUTER["router"], "hold": {"timeoutSeconds": 120}}}


@pytest.fixture(scope="module")
def release(
    control_plane: ControlPlane, kube_node: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    logs = tmp_path_factory.mktemp("scale-to-zero")
    with (
        installed(control_plane, logs, VALUES, wait=True) as release,
        release.operator(logs / "operator.log", env=OPERATOR_ENV),
    ):
        yield release


def ready_condition(release: Release, name: str) -> dict[str, Any]:
    for condition in ((release.get("bd", name) or {}).get("status") or {}).get("conditions", []):
        if condition["type"] == "Ready":
            return dict(condition)
    return {}


def event_messages(release: Release, name: str, reason: str) -> list[str]:
    listed = release.cluster.kubectl(
        "get",
        "events",
        "-n",
        release.namespace,
        f"--field-selector=reason={reason},involvedObject.name={name}",
        "-o",
        "json",
    )
    return [event["message"] for event in json.loads(listed.stdout)["items"]]


def test_an_idle_deployment_goes_to_zero_and_a_request_through_the_router_wakes_it(release: Release) -> None:
    autoscaling = {"min_replicas": 0, "max_replicas": 2, "scale_to_zero_delay_s": DELAY_S}
    release.apply(manifest("sleepy", num_replicas=1, autoscaling=autoscaling))
    eventually(lambda: release.pods("sleepy", ready=True), timeout_s=120, what="the first replica")

    condition = eventually(
        lambda: (found := ready_condition(release, "sleepy")).get("reason") == "ScaledToZero" and found,
        timeout_s=60,
        what="Ready=False ScaledToZero",
    )
    assert "a request through the router starts a replica" in condition["message"]
    eventually(lambda: not release.pods("sleepy"), timeout_s=60, what="the replica pod gone")
    # Two events of that reason: the scale, and the Ready condition's transition.
    went = eventually(
        lambda: [m for m in event_messages(release, "sleepy", "ScaledToZero") if m.startswith("1 -> 0")],
        what="the ScaledToZero event",
    )
    assert went == [
        f"1 -> 0 replicas: idle for {DELAY_S} s: no item on the replicas, no request held by the routers"
    ]

    # The request a client sends, to the Service the deployment's status names.
    url = (release.get("bd", "sleepy") or {})["status"]["url"]
    router = release.get("service", f"{release.name}-router")
    assert router is not None and url.startswith(f"http://{release.name}-router.{release.namespace}.svc")
    sent = time.monotonic()
    answer = httpx.post(
        f"http://{router['spec']['clusterIP']}/v1/models/sleepy:predict",
        json={"instances": [1, 2]},
        timeout=150,
    )
    cold_start_s = time.monotonic() - sent
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"predictions": [2, 3]}
    (woke,) = eventually(
        lambda: event_messages(release, "sleepy", "ScaledFromZero"), what="the ScaledFromZero event"
    )
    assert woke.startswith("0 -> 1 replicas: 1 request(s) held by the routers"), woke
    assert len(release.pods("sleepy", ready=True)) == 1
    print(f"cold start through the router: {cold_start_s:.1f} s")
