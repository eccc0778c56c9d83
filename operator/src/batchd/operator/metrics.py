"""The operator's own Prometheus metrics (prefix `batchd_operator_`), served on :9090/metrics.

Reconcile metrics are labelled by outcome only. The replica gauges carry one series per
BatchedDeployment (namespace, deployment), as kube-state-metrics does per Deployment: the
dashboard's "desired vs ready replicas" panel needs the desired count, which only the operator
knows.
"""

from __future__ import annotations

import contextlib
import math

from prometheus_client import Counter, Gauge, Histogram

from batchd.operator.analysis import Answers
from batchd.operator.rollout import EVENT_REASONS

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


CANARY_PERCENT = _per_resource(
    "batchd_operator_canary_traffic_percent",
    "The canary revision's share of a BatchedDeployment's requests now, in percent (0: none).",
)
TRACKS = ("stable", "canary")
PHASES = ("none", *EVENT_REASONS)
WINDOW_ANSWERED = Gauge(
    "batchd_operator_canary_window_answers",
    "Requests each revision answered in the canary step being judged, by track (stable, canary).",
    ["namespace", "deployment", "track"],
)
WINDOW_ERROR_RATIO = Gauge(
    "batchd_operator_canary_window_error_ratio",
    "Share of each revision's answers in the step that were errors or timeouts, by track.",
    ["namespace", "deployment", "track"],
)
WINDOW_P99 = Gauge(
    "batchd_operator_canary_window_p99_seconds",
    "Each revision's p99 latency in the step, from its replicas' histograms, by track (NaN: none).",
    ["namespace", "deployment", "track"],
)


def record_step(namespace: str, deployment: str, canary: Answers, stable: Answers) -> None:
    """What the canary's judge last saw of the step being judged."""
    for track, answers in zip(TRACKS, (stable, canary), strict=True):
        p99 = answers.p99()
        WINDOW_ANSWERED.labels(namespace, deployment, track).set(answers.answered)
        WINDOW_ERROR_RATIO.labels(namespace, deployment, track).set(answers.error_rate)
        WINDOW_P99.labels(namespace, deployment, track).set(math.nan if p99 is None else p99)


ROLLOUT_PHASE = Gauge(
    "batchd_operator_rollout_phase",
    "1 for the phase a BatchedDeployment's rollout is in (status.rollout.phase; `none` before its "
    "first canary rollout), 0 for the others.",
    ["namespace", "deployment", "phase"],
)


def record_rollout_state(namespace: str, deployment: str, phase: str, percent: int, judged: bool) -> None:
    """A rollout's phase and share, from converge; the step's figures read zero (p99: NaN) while
    no step is being judged, so that their panels say so rather than nothing."""
    CANARY_PERCENT.labels(namespace, deployment).set(percent)
    for name in PHASES:
        ROLLOUT_PHASE.labels(namespace, deployment, name).set(1 if name == (phase or "none") else 0)
    if not judged:
        record_step(namespace, deployment, Answers(), Answers())


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
    _remove(
        namespace,
        deployment,
        DESIRED_REPLICAS,
        READY_REPLICAS,
        REPLICA_LOAD,
        RECOMMENDED_REPLICAS,
        CANARY_PERCENT,
    )
    for gauge, labels in [
        *((gauge, TRACKS) for gauge in (WINDOW_ANSWERED, WINDOW_ERROR_RATIO, WINDOW_P99)),
        (ROLLOUT_PHASE, PHASES),
    ]:
        for label in labels:
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, deployment, label)
