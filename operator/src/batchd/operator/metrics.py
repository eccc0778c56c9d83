"""The operator's own Prometheus metrics (prefix `batchd_operator_`), served on :9090/metrics.

Reconcile metrics are labelled by outcome only. The replica gauges carry one series per
BatchedDeployment (namespace, deployment), as kube-state-metrics does per Deployment: the
dashboard's "desired vs ready replicas" panel needs the desired count, which only the operator
knows.
"""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

OUTCOMES = ("success", "invalid", "refused", "error")

RECONCILES = Counter(
    "batchd_operator_reconciles",
    "Reconciles of BatchedDeployments, by outcome: success, invalid (spec refused), "
    "refused (the API server refused a child) or error (to be retried).",
    ["outcome"],
)
RECONCILE_DURATION = Histogram(
    "batchd_operator_reconcile_duration_seconds",
    "Time to bring one BatchedDeployment's children and status in line with its spec.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
for _outcome in OUTCOMES:  # every series exists from the start, so rate() sees the first increment
    RECONCILES.labels(outcome=_outcome)


def _per_resource(name: str, documentation: str) -> Gauge:
    """A gauge with one series per BatchedDeployment."""
    return Gauge(name, documentation, ["namespace", "deployment"])


DESIRED_REPLICAS = _per_resource(
    "batchd_operator_desired_replicas",
    "Replicas the operator asks of each BatchedDeployment's Deployment: num_replicas, "
    "or the autoscaler's count.",
)
READY_REPLICAS = _per_resource(
    "batchd_operator_ready_replicas",
    "Ready replica pods of each BatchedDeployment, as its Deployment reports them.",
)


REPLICA_LOAD = _per_resource(
    "batchd_operator_replica_load",
    "Items queued or in the model over the ready replicas of each autoscaled BatchedDeployment, "
    "as the operator last read them.",
)
RECOMMENDED_REPLICAS = _per_resource(
    "batchd_operator_recommended_replicas",
    "Replicas the load alone asks for (before the up- and downscale delays), per autoscaled resource.",
)
SCALES = Counter(
    "batchd_operator_scales",
    "Replica counts the autoscaler changed, by direction (up, down).",
    ["direction"],
)
for _direction in ("up", "down"):
    SCALES.labels(direction=_direction)


def _set(namespace: str, deployment: str, *values: tuple[Gauge, float]) -> None:
    for gauge, value in values:
        gauge.labels(namespace, deployment).set(value)


def _remove(namespace: str, deployment: str, *gauges: Gauge) -> None:
    for gauge in gauges:
        with contextlib.suppress(KeyError):  # never set for this resource
            gauge.remove(namespace, deployment)


def record_load(namespace: str, deployment: str, load: int, recommended: int) -> None:
    _set(namespace, deployment, (REPLICA_LOAD, load), (RECOMMENDED_REPLICAS, recommended))


def forget_load(namespace: str, deployment: str) -> None:
    _remove(namespace, deployment, REPLICA_LOAD, RECOMMENDED_REPLICAS)


def record_replicas(namespace: str, deployment: str, desired: int, ready: int) -> None:
    _set(namespace, deployment, (DESIRED_REPLICAS, desired), (READY_REPLICAS, ready))


def forget(namespace: str, deployment: str) -> None:
    """Drop a deleted resource's series, so dashboards do not show it forever."""
    _remove(namespace, deployment, DESIRED_REPLICAS, READY_REPLICAS, REPLICA_LOAD, RECOMMENDED_REPLICAS)
