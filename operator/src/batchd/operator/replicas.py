"""The replica pods of each BatchedDeployment, and the load each one reports about itself.

The operator keeps a Kopf index of the replica pods (by the labels it gave their template) and,
for the ready ones, reads `GET /load` on the pod's own address: the items queued and in the
model, and the batching revision it runs. No Prometheus adapter and no metrics pipeline sits
in between, so a decision is as fresh as the last poll.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from batchd.api.pod import CANARY_COMPONENT

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"


@dataclass(frozen=True)
class ReplicaPod:
    """What the operator needs to know of one replica pod."""

    name: str
    ip: str
    port: int
    ready: bool  # the kubelet's Ready condition
    terminating: bool  # deletionTimestamp set: draining, about to go
    deletion_cost: int | None  # our pod-deletion-cost annotation, as last written
    canary: bool = False  # a canary revision's pod (its component label), else the stable one's

    @property
    def serving(self) -> bool:
        return self.ready and not self.terminating and bool(self.ip)


@dataclass(frozen=True)
class ReplicaLoad:
    pod: ReplicaPod
    items: int  # queued plus in the model
    batching_revision: int
    sheddable_items: int = 0  # of `items`, those of sheddable priority classes

    def counted(self, count_sheddable: bool) -> int:
        """The items autoscaling counts: every one, or all but the sheddable ones."""
        return self.items if count_sheddable else self.items - self.sheddable_items


def replica_pod(
    name: str, meta: Mapping[str, Any], spec: Mapping[str, Any], status: Mapping[str, Any]
) -> ReplicaPod:
    """A pod object (as Kopf hands it to the index) reduced to what the operator reads."""
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    ports = [
        port.get("containerPort")
        for container in spec.get("containers") or []
        for port in container.get("ports") or []
        if port.get("name") == "http"
    ]
    cost = (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION)
    return ReplicaPod(
        name=name,
        ip=str(status.get("podIP") or ""),
        port=int(ports[0]) if ports else 0,
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        deletion_cost=int(cost) if cost is not None and str(cost).lstrip("-").isdigit() else None,
        canary=(meta.get("labels") or {}).get(COMPONENT_LABEL) == CANARY_COMPONENT[COMPONENT_LABEL],
    )


async def read_loads(
    session: aiohttp.ClientSession, pods: Sequence[ReplicaPod], timeout_s: float
) -> list[ReplicaLoad]:
    """The load of every serving pod that answers within `timeout_s`; the others are left out."""
    answers = await asyncio.gather(*(_read(session, pod, timeout_s) for pod in pods if pod.serving))
    return [answer for answer in answers if answer is not None]


async def _read(session: aiohttp.ClientSession, pod: ReplicaPod, timeout_s: float) -> ReplicaLoad | None:
    body = await read_json(session, pod, "/load", timeout_s)
    try:
        if body is None or not body.get("ready"):
            return None
        items = int(body["queued_items"]) + int(body["running_items"])
        return ReplicaLoad(pod, items, int(body["batching_revision"]), int(body.get("sheddable_items", 0)))
    except (ValueError, KeyError, TypeError):
        return None  # a replica that cannot say is not counted; the next poll asks again


async def read_text(
    session: aiohttp.ClientSession, pod: ReplicaPod, path: str, timeout_s: float
) -> str | None:
    """`GET path` on the pod's own address: the text it answers with 200, else None (no answer
    within `timeout_s`, another status)."""
    try:
        async with session.get(
            f"http://{pod.ip}:{pod.port}{path}", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            if response.status != 200:
                return None
            return await response.text()
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None


async def read_json(
    session: aiohttp.ClientSession, pod: ReplicaPod, path: str, timeout_s: float
) -> dict[str, Any] | None:
    """`GET path` on the pod's own address: the JSON object it answers with 200, else None (no
    answer within `timeout_s`, another status, not a JSON object)."""
    text = await read_text(session, pod, path, timeout_s)
    try:
        body = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return body if isinstance(body, dict) else None
