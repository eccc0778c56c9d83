"""What operator.json holds, as frozen dataclasses: convergence, and the steady cost of polling."""

from __future__ import annotations

from dataclasses import dataclass

from batchd.bench.kit.records import RunRecord


@dataclass(frozen=True)
class Convergence:
    """Single creates timed one after another, then many created at once until all converged."""

    repeats: int
    create_to_deployment_median_ms: float
    create_to_deployment_p90_ms: float
    bulk_resources: int
    bulk_create_s: float
    bulk_converge_s: float  # children and a status for every one
    bulk_per_second: float
    bulk_operator_cpu_s: float
    operator_rss_idle_peak_mib: float
    operator_rss_after_bulk_mib: float
    operator_rss_peak_mib: float


@dataclass(frozen=True)
class Window:
    """One window of the polling steady state (times from time.time())."""

    start: float
    end: float
    operator_cores: float
    load_endpoints_cores: float
    status_writes: int
    watch_restarts: int  # Kopf lists everything again each time a watch stream ends and restarts
    polls_per_s: float
    replicas_polled: int


@dataclass(frozen=True)
class Polling:
    """The operator polling every replica of `resources` autoscaled resources, in steady state."""

    resources: int
    replicas: int
    poll_interval_s: float
    setup_s: float
    steady_s: float
    windows: list[Window]
    operator_cores_median: float
    operator_cores_max: float
    operator_cores_mean: float
    load_endpoints_cores_median: float
    operator_rss_mib: float
    operator_rss_peak_mib: float
    polls_per_s: float
    expected_polls_per_s: float
    replicas_polled: int
    polls_per_replica_min: int
    polls_per_replica_max: int
    expected_polls_per_replica: float
    rounds: int
    round_spread_ms_median: float
    round_period_s_median: float
    status_writes: int
    status_writes_per_s: float
    operator_calls: dict[str, int]  # API calls by method/resource, in steady state


@dataclass(frozen=True)
class OperatorResult:
    meta: RunRecord
    convergence: Convergence
    autoscaling: Polling | None  # None: not measured (--autoscaled 0)
