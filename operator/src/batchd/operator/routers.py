"""What the routers hold: the requests waiting for a deployment that has no ready replica.

A deployment at zero replicas has no replica to report load, so the demand that wakes it comes
from the routers in front of it: each answers `GET /held` with the requests it holds per
deployment. The operator finds the router pods with one LIST of pods by label in the router's
namespace per poll (it may list pods already, so no new permission; a watch would need the
router's namespace among Kopf's watched ones), and reads every ready router's /held on the same
poll as the replicas' /load, on its admin port (`ROUTER_ADMIN_PORT`), which clients' requests
never reach. What the routers hold for one deployment is summed.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from batchd.api.kube_connection import resource_path
from batchd.operator.autoscaler import Held
from batchd.operator.kube_requests import KubeApi
from batchd.operator.replicas import ReplicaPod, read_json, replica_pod

Key = tuple[str, str]  # (namespace, name) of a BatchedDeployment
# The router's container port of /metrics and /held (ROUTER_ADMIN_PORT), never its clients' port.
ADMIN_PORT_NAME = "admin"


def held_per_deployment(answers: Sequence[Mapping[str, Any]]) -> dict[Key, Held]:
    """The `GET /held` answers of all routers, summed per deployment; entries that are not what
    the router documents are skipped (one router's bad answer must not hide the others')."""
    held: dict[Key, Held] = {}
    for answer in answers:
        entries = answer.get("deployments")
        for entry in entries if isinstance(entries, list) else []:
            try:
                key = (str(entry["namespace"]), str(entry["name"]))
                one = Held(int(entry["held_requests"]), float(entry["oldest_held_s"]))
            except (KeyError, TypeError, ValueError):
                continue
            if one.requests > 0:
                held[key] = held.get(key, Held()) + one
    return held


def router_pods(pod_list: Mapping[str, Any], selector: str) -> list[ReplicaPod]:
    """The router pods of a pod LIST answer, with their address (the admin port, where a router
    serves /held; its http port where it has none: a router of an earlier release) and readiness.
    The equality `selector` is checked here too: a pod that lacks its labels is never read."""
    wanted = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
    pods = []
    for item in pod_list.get("items") or []:
        metadata = item.get("metadata") or {}
        labels = metadata.get("labels") or {}
        if all(labels.get(key) == value for key, value in wanted.items()):
            pods.append(
                replica_pod(
                    str(metadata.get("name", "")),
                    metadata,
                    item.get("spec") or {},
                    item.get("status") or {},
                    port_name=ADMIN_PORT_NAME,
                )
            )
    return pods


async def list_router_pods(api: KubeApi, namespace: str, selector: str) -> list[ReplicaPod]:
    path = (
        resource_path("v1", "pods", namespace) + "?labelSelector=" + urllib.parse.quote(selector, safe="=,")
    )
    return router_pods(await api.request("GET", path), selector)


async def read_held(
    session: aiohttp.ClientSession, pods: Sequence[ReplicaPod], timeout_s: float
) -> dict[Key, Held] | None:
    """What every serving router holds; None when one of them did not answer within `timeout_s`:
    it may hold requests, so no deployment may count this poll as idle."""
    answers = await asyncio.gather(
        *(read_json(session, pod, "/held", timeout_s) for pod in pods if pod.serving)
    )
    if any(answer is None for answer in answers):
        return None
    return held_per_deployment([answer for answer in answers if answer is not None])
