"""The EndpointSlice controller's decisions, as pure functions: which slices a Service should have.

As Kubernetes' own controller makes them
(https://kubernetes.io/docs/concepts/services-networking/endpoint-slices/): for each Service with a
selector, the pods it selects that have an address and have not finished, grouped by the ports
they resolve the Service's ports to (a named `targetPort` is looked up in each pod's containers,
so pods whose ports differ land in separate slices), at most 100 endpoints a slice. Each slice
carries the Service's labels plus `kubernetes.io/service-name` and
`endpointslice.kubernetes.io/managed-by`, is owned by the Service (deleted with it), and each
endpoint says `ready` (the pod is Ready and not terminating; always, with
`publishNotReadyAddresses`), `serving` (the pod is Ready, terminating or not) and `terminating`.
A Service with no selected pod keeps one placeholder slice with no endpoints and no ports.

`batchd.testing.cluster` runs these every round and writes the differences through the API.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from batchd.testing.pods import is_finished, is_ready, is_terminating

Manifest = dict[str, Any]

ENDPOINT_SLICES = "discovery.k8s.io/endpointslices"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
CONTROLLER_NAME = "endpointslice-controller.k8s.io"
# The controller's --max-endpoints-per-slice default.
MAX_ENDPOINTS_PER_SLICE = 100


def selects_pod(service: Manifest, pod: Manifest) -> bool:
    """A Service's selector (plain equality, its only form) matches the pod's labels; an empty or
    missing selector selects nothing here (such a Service's endpoints are managed by hand)."""
    selector: Mapping[str, str] = (service.get("spec") or {}).get("selector") or {}
    labels = pod["metadata"].get("labels") or {}
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def _container_port(pod: Manifest, name: str, protocol: str) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name and port.get("protocol", "TCP") == protocol:
                return int(port["containerPort"])
    return None


def endpoint_ports(service: Manifest, pod: Manifest) -> list[Manifest]:
    """The Service's ports as this pod serves them; a named targetPort the pod lacks is left out."""
    ports = []
    for service_port in (service.get("spec") or {}).get("ports") or []:
        protocol = service_port.get("protocol", "TCP")
        target = service_port.get("targetPort", service_port["port"])
        number = _container_port(pod, target, protocol) if isinstance(target, str) else int(target)
        if number is not None:
            ports.append({"name": service_port.get("name", ""), "port": number, "protocol": protocol})
    return ports


def endpoint(pod: Manifest, *, publish_not_ready: bool = False) -> Manifest:
    meta = pod["metadata"]
    serving = is_ready(pod)
    terminating = is_terminating(pod)
    return {
        "addresses": [pod["status"]["podIP"]],
        "conditions": {
            "ready": publish_not_ready or (serving and not terminating),
            "serving": serving,
            "terminating": terminating,
        },
        "nodeName": (pod.get("spec") or {}).get("nodeName", ""),
        "targetRef": {
            "kind": "Pod",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
        },
    }


def _slice(service: Manifest, ports: list[Manifest] | None, endpoints: list[Manifest]) -> Manifest:
    meta = service["metadata"]
    document: Manifest = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "generateName": f"{meta['name']}-",
            "namespace": meta["namespace"],
            "labels": {
                **(meta.get("labels") or {}),
                SERVICE_NAME_LABEL: meta["name"],
                MANAGED_BY_LABEL: CONTROLLER_NAME,
            },
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
    }
    if ports is not None:
        document["ports"] = ports
    return document


def desired_slices(service: Manifest, pods: Iterable[Manifest]) -> list[Manifest]:
    """Every slice the Service should have (without names), its endpoints in pod-name order."""
    publish = bool((service.get("spec") or {}).get("publishNotReadyAddresses"))
    groups: dict[str, tuple[list[Manifest], list[Manifest]]] = {}
    for pod in sorted(pods, key=lambda pod: str(pod["metadata"]["name"])):
        if not selects_pod(service, pod) or is_finished(pod) or not (pod.get("status") or {}).get("podIP"):
            continue
        ports = endpoint_ports(service, pod)
        _, endpoints = groups.setdefault(_ports_key(ports), (ports, []))
        endpoints.append(endpoint(pod, publish_not_ready=publish))
    if not groups:
        return [_slice(service, None, [])]  # the placeholder
    return [
        _slice(service, ports, endpoints[start : start + MAX_ENDPOINTS_PER_SLICE])
        for ports, endpoints in groups.values()
        for start in range(0, len(endpoints), MAX_ENDPOINTS_PER_SLICE)
    ]


def _ports_key(ports: list[Manifest] | None) -> str:
    return json.dumps(sorted(ports or [], key=lambda port: (port["name"], port["port"])), sort_keys=True)


def managed_slices(service: Manifest, slices: Iterable[Manifest]) -> list[Manifest]:
    """The slices this controller made for the Service (others, made by hand, are left alone)."""
    name = service["metadata"]["name"]
    return [
        found
        for found in slices
        if (found["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) == name
        and (found["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == CONTROLLER_NAME
    ]


def slice_changes(
    desired: list[Manifest], existing: list[Manifest]
) -> tuple[list[Manifest], list[tuple[str, list[Manifest]]], list[str]]:
    """(slices to create, (name, JSON patch) for slices to change, names of slices to delete).

    An existing slice with the same ports is reused, so a pod turning ready changes one slice in
    place, as the controller does, rather than replacing it.
    """
    by_ports: dict[str, list[Manifest]] = {}
    for found in existing:
        by_ports.setdefault(_ports_key(found.get("ports")), []).append(found)
    creates: list[Manifest] = []
    patches: list[tuple[str, list[Manifest]]] = []
    for wanted in desired:
        candidates = by_ports.get(_ports_key(wanted.get("ports")), [])
        if not candidates:
            creates.append(wanted)
            continue
        found = candidates.pop(0)
        operations = [
            {"op": "add", "path": path, "value": value}
            for path, value, current in (
                ("/endpoints", wanted["endpoints"], found.get("endpoints")),
                ("/metadata/labels", wanted["metadata"]["labels"], found["metadata"].get("labels")),
            )
            if value != current
        ]
        if operations:
            patches.append((found["metadata"]["name"], operations))
    deletes = [found["metadata"]["name"] for leftover in by_ports.values() for found in leftover]
    return creates, patches, deletes
