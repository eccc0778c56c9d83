"""The replica pods of each BatchedDeployment, and what each one reports about itself.

The operator follows the replica pods by watch (by the labels it gave their template) and, for
the serving ones, reads the pod's own address: `GET /load` (the items queued and in the model,
and the batching revision it runs) at every poll, and `GET /metrics` on its metrics port (its
answers by outcome and duration) when a canary step is judged. No Prometheus adapter and no
metrics pipeline sits in between, so a decision is as fresh as the last poll.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from batchd.api.pod import REVISION_LABEL, STABLE, Track, track_of
from batchd.operator.analysis import Answers, parse_answers

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"


@dataclass(frozen=True)
class ReplicaPod:
    """What the operator needs to know of one replica pod."""

    name: str
    ip: str
    port: int
    ready: bool  # the kubelet's Ready condition
    terminating: bool  # deletionTimestamp set: draining, about to go
    deletion_cost: int | None  # our pod-deletion-cost annotation, as last written
    revision: str = ""  # the revision it serves (its revision label)
    track: Track = STABLE  # which Deployment made it
    uid: str = ""
    restarts: int = 0  # of its containers, summed
    # Where it serves /metrics (a replica's container port "metrics"); `port` where it names none
    # (a replica of a release that served /metrics beside inference).
    metrics_port: int = 0

    @property
    def scrape_port(self) -> int:
        return self.metrics_port or self.port

    @property
    def serving(self) -> bool:
        return self.ready and not self.terminating and bool(self.ip)

    @property
    def identity(self) -> str:
        """One process's lifetime: a restarted container counts its answers from zero again."""
        return f"{self.uid or self.name}/{self.restarts}"


@dataclass(frozen=True)
class ReplicaLoad:
    pod: ReplicaPod
    items: int  # queued plus in the model
    batching_revision: int
    sheddable_items: int = 0  # of `items`, those of sheddable priority classes

    def counted(self, count_sheddable: bool) -> int:
        """The items autoscaling counts: every one, or all but the sheddable ones."""
        return self.items if count_sheddable else self.items - self.sheddable_items


@dataclass(frozen=True)
class Reading:
    """What one serving replica said at one poll; None for what it did not say (or was not asked)."""

    pod: ReplicaPod
    load: ReplicaLoad | None
    answers: Answers | None = None


def container_port(spec: Mapping[str, Any], name: str) -> int:
    """The pod's container port called `name`; 0 where it has none."""
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name and port.get("containerPort"):
                return int(port["containerPort"])
    return 0


def replica_pod(
    name: str,
    meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    port_name: str = "http",
) -> ReplicaPod:
    """A pod object (as Kopf hands it to the handler) reduced to what the operator reads; `port`
    is its container port `port_name` (the http one where it names none)."""
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    cost = (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION)
    labels = dict(meta.get("labels") or {})
    owner = track_of(labels)
    return ReplicaPod(
        name=name,
        ip=str(status.get("podIP") or ""),
        port=container_port(spec, port_name) or container_port(spec, "http"),
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        deletion_cost=int(cost) if cost is not None and str(cost).lstrip("-").isdigit() else None,
        revision=labels.get(REVISION_LABEL, ""),
        track=owner[1] if owner else STABLE,
        uid=str(meta.get("uid") or ""),
        restarts=sum(int(found.get("restartCount") or 0) for found in status.get("containerStatuses") or []),
        metrics_port=container_port(spec, "metrics"),
    )


async def read_replicas(
    session: aiohttp.ClientSession, pods: Sequence[ReplicaPod], timeout_s: float, *, answers: bool
) -> list[Reading]:
    """What every serving pod says within `timeout_s`: its load, and with `answers` its answers."""
    serving = [pod for pod in pods if pod.serving]
    loads = asyncio.gather(*(_load(session, pod, timeout_s) for pod in serving))
    if not answers:
        return [Reading(pod, load) for pod, load in zip(serving, await loads, strict=True)]
    counted = asyncio.gather(*(_answers(session, pod, timeout_s) for pod in serving))
    found = await asyncio.gather(loads, counted)
    return [Reading(pod, load, answers) for pod, load, answers in zip(serving, *found, strict=True)]


async def _load(session: aiohttp.ClientSession, pod: ReplicaPod, timeout_s: float) -> ReplicaLoad | None:
    body = await read_json(session, pod, "/load", timeout_s)
    try:
        if body is None or not body.get("ready"):
            return None
        items = int(body["queued_items"]) + int(body["running_items"])
        return ReplicaLoad(pod, items, int(body["batching_revision"]), int(body.get("sheddable_items", 0)))
    except (ValueError, KeyError, TypeError):
        return None  # a replica that cannot say is not counted; the next poll asks again


async def _answers(session: aiohttp.ClientSession, pod: ReplicaPod, timeout_s: float) -> Answers | None:
    text = await read_text(session, pod, "/metrics", timeout_s, port=pod.scrape_port)
    try:
        return parse_answers(text) if text is not None else None
    except ValueError:
        return None  # not a replica's metrics (yet): left out of this look


async def read_text(
    session: aiohttp.ClientSession, pod: ReplicaPod, path: str, timeout_s: float, port: int = 0
) -> str | None:
    """`GET path` on the pod's own address (its `port`, or another): the text it answers with
    200, else None (no answer within `timeout_s`, another status)."""
    try:
        async with session.get(
            f"http://{pod.ip}:{port or pod.port}{path}", timeout=aiohttp.ClientTimeout(total=timeout_s)
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
