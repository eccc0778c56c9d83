"""The stand-in cluster's EndpointSlice controller keeps each Service's slices as Kubernetes' own does.

The rules are pure functions (`batchd.testing.endpointslices`), checked on their own; then the
controller runs in `Cluster` against the emulated API server, which validates every slice it
writes against the Kubernetes schemas. Pods there are made through the API with no node, so no
kubelet runs them: the test sets their address and readiness through `/status`, as a kubelet would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batchd.testing.apiserver import ApiServer
from batchd.testing.cluster import Cluster
from batchd.testing.endpointslices import (
    CONTROLLER_NAME,
    MANAGED_BY_LABEL,
    SERVICE_NAME_LABEL,
    desired_slices,
    slice_changes,
)
from batchd.testing.operator_runner import api_server, call, eventually

NS = "default"
SERVICE_LABELS = {"app.kubernetes.io/name": "batchd-replica", "app.kubernetes.io/instance": "adder"}
SELECTOR = {"app.kubernetes.io/instance": "adder"}


def service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "adder", "namespace": NS, "labels": SERVICE_LABELS},
        "spec": {
            "selector": SELECTOR,
            "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def pod(name: str, *, port: int = 8000, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels or SELECTOR},
        "spec": {
            "containers": [
                {"name": "replica", "image": "replica", "ports": [{"name": "http", "containerPort": port}]}
            ]
        },
    }


def status(ip: str, *, ready: bool) -> dict[str, Any]:
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {"phase": "Running", "podIP": ip, "conditions": [condition]}


def with_status(document: dict[str, Any], ip: str, *, ready: bool, uid: str = "") -> dict[str, Any]:
    return {
        **document,
        "metadata": {**document["metadata"], "uid": uid or ip},
        "status": status(ip, ready=ready),
    }


def test_slices_group_pods_by_the_ports_they_serve_and_say_which_are_ready() -> None:
    svc = {**service(), "metadata": {**service()["metadata"], "uid": "svc"}}
    pods = [
        with_status(pod("a"), "127.0.0.2", ready=True),
        with_status(pod("b"), "127.0.0.3", ready=False),
        with_status(pod("c", port=9000), "127.0.0.4", ready=True),
        with_status(pod("other", labels={"app": "other"}), "127.0.0.5", ready=True),
        {**pod("unscheduled"), "metadata": {**pod("unscheduled")["metadata"], "uid": "u"}},  # no address
    ]
    terminating = with_status(pod("d"), "127.0.0.6", ready=True)
    terminating["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    slices = desired_slices(svc, [*pods, terminating])
    assert [s["ports"] for s in slices] == [
        [{"name": "http", "port": 8000, "protocol": "TCP"}],
        [{"name": "http", "port": 9000, "protocol": "TCP"}],
    ]
    conditions = {
        e["targetRef"]["name"]: (e["addresses"], e["conditions"]) for s in slices for e in s["endpoints"]
    }
    assert conditions == {
        "a": (["127.0.0.2"], {"ready": True, "serving": True, "terminating": False}),
        "b": (["127.0.0.3"], {"ready": False, "serving": False, "terminating": False}),
        "c": (["127.0.0.4"], {"ready": True, "serving": True, "terminating": False}),
        "d": (["127.0.0.6"], {"ready": False, "serving": True, "terminating": True}),
    }
    assert slices[0]["metadata"]["labels"] == {
        **SERVICE_LABELS,
        SERVICE_NAME_LABEL: "adder",
        MANAGED_BY_LABEL: CONTROLLER_NAME,
    }
    assert slices[0]["metadata"]["ownerReferences"][0]["uid"] == "svc"
    # No pod at all: one placeholder slice, no endpoints, no ports.
    (placeholder,) = desired_slices(svc, [])
    assert placeholder["endpoints"] == [] and "ports" not in placeholder


def test_a_slice_with_the_same_ports_is_changed_in_place_and_leftovers_go() -> None:
    svc = {**service(), "metadata": {**service()["metadata"], "uid": "svc"}}
    before = desired_slices(svc, [with_status(pod("a"), "127.0.0.2", ready=False)])
    existing = [{**before[0], "metadata": {**before[0]["metadata"], "name": "adder-x"}}]
    stale = json.loads(json.dumps(existing[0]))
    stale["metadata"]["name"] = "adder-old"
    stale["ports"] = [{"name": "http", "port": 7000, "protocol": "TCP"}]
    after = desired_slices(svc, [with_status(pod("a"), "127.0.0.2", ready=True)])
    creates, patches, deletes = slice_changes(after, [*existing, stale])
    assert creates == [] and deletes == ["adder-old"]
    ((name, operations),) = patches
    assert name == "adder-x"
    assert [op["path"] for op in operations] == ["/endpoints"]
    assert operations[0]["value"][0]["conditions"]["ready"] is True
    assert slice_changes(after, [{**after[0], "metadata": {**after[0]["metadata"], "name": "n"}}]) == (
        [],
        [],
        [],
    )


async def _call(server: ApiServer, method: str, path: str, body: Any = None, patch: bool = False) -> Any:
    return await call(
        server, method, path, body, "application/json-patch+json" if patch else "application/json"
    )


def _slices(server: ApiServer) -> list[dict[str, Any]]:
    found = server.list_objects("discovery.k8s.io/endpointslices", NS)
    return sorted(found, key=lambda s: [p["port"] for p in s.get("ports") or []])


def _endpoints(server: ApiServer) -> dict[str, dict[str, bool]]:
    return {e["targetRef"]["name"]: e["conditions"] for s in _slices(server) for e in s["endpoints"]}


async def test_the_cluster_keeps_a_services_slices_up_to_date_with_its_pods(tmp_path: Path) -> None:
    pods = f"/api/v1/namespaces/{NS}/pods"
    async with api_server(tmp_path) as server, Cluster(server, tmp_path / "cluster"):
        await _call(server, "POST", f"/api/v1/namespaces/{NS}/services", service())
        placeholder = await eventually(lambda: _slices(server), what="a placeholder slice")
        assert placeholder[0]["endpoints"] == []
        for name, port in (("a", 8000), ("b", 8000), ("c", 9000)):
            await _call(server, "POST", pods, pod(name, port=port))
        for name, ip, ready in (
            ("a", "127.0.0.2", True),
            ("b", "127.0.0.3", False),
            ("c", "127.0.0.4", True),
        ):
            operations = [{"op": "add", "path": "/status", "value": status(ip, ready=ready)}]
            await _call(server, "PATCH", f"{pods}/{name}/status", operations, patch=True)

        def listed() -> Any:
            return len(_slices(server)) == 2 and _endpoints(server).keys() == {"a", "b", "c"}

        await eventually(listed, what="two slices holding the three pods")
        first, second = _slices(server)
        assert [e["targetRef"]["name"] for e in first["endpoints"]] == ["a", "b"]
        assert (first["ports"][0]["port"], second["ports"][0]["port"]) == (8000, 9000)
        assert first["metadata"]["labels"][SERVICE_NAME_LABEL] == "adder"
        name = first["metadata"]["name"]
        # b turns ready: its slice changes in place.
        operations = [{"op": "add", "path": "/status", "value": status("127.0.0.3", ready=True)}]
        await _call(server, "PATCH", f"{pods}/b/status", operations, patch=True)
        await eventually(lambda: _endpoints(server)["b"]["ready"], what="b ready in its slice")
        assert _slices(server)[0]["metadata"]["name"] == name
        # c goes (no node: at once): its slice goes with it.
        await _call(server, "DELETE", f"{pods}/c")
        await eventually(lambda: len(_slices(server)) == 1, what="the 9000 slice gone")
        # The Service goes: its slices are garbage-collected with it.
        await _call(server, "DELETE", f"/api/v1/namespaces/{NS}/services/adder")
        await eventually(lambda: _slices(server) == [], what="the slices gone with the Service")
        assert server.calls == []  # none of it was the operator's
