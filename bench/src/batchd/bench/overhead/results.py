"""What a run of the overhead benchmark found: every measurement, and the medians reported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Measurement:
    """One subject under one closed-loop run."""

    subject: str
    repeat: int
    requests: int
    errors: int
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    server_cpu_s: float  # the server's processes, over the measured window
    client_cpu_s: float  # the load generator's, over the whole run

    @property
    def server_cpu_ms_per_request(self) -> float:
        return self.server_cpu_s * 1000 / self.requests if self.requests else float("nan")


@dataclass(frozen=True)
class Summary:
    """One subject's medians over the repeats."""

    subject: str
    repeats: int
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    server_cpu_ms_per_request: float
    errors: int  # over every repeat


@dataclass(frozen=True)
class Results:
    meta: dict[str, Any]  # RunRecord fields
    clients: int
    duration_s: float
    measurements: list[Measurement]
    summaries: list[Summary]
    # (subject, reference) -> {figure: subject's median / reference's median}
    ratios: dict[str, dict[str, float]]
