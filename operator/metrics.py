"""The operator's own Prometheus metrics (prefix `batchd_operator_`), served on :9090/metrics.

Labels stay low-cardinality: the outcome of a reconcile, never the resource's name.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

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
