"""What autoscaling.json holds, as frozen dataclasses: each subject's run through the load step,
medians over the repeats, and the calibration (read back with `kit.records.from_json`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from batchd.bench.autoscaling.options import Options
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.stats import median

FIGURES = (
    # (key, label, unit) as the report lists them
    ("idle_p99_ms", "p99 before the step", "ms"),
    ("step_p50_ms", "p50 during the step", "ms"),
    ("step_p99_ms", "p99 during the step", "ms"),
    ("step_ok_rps", "answered 200 during the step", "req/s"),
    ("refused_503_in_step", "refused (503) during the step", ""),
    ("unanswered", "without a usable answer", ""),
    ("peak_ready", "peak ready replicas", ""),
    ("peak_queued", "peak total queue", "items"),
    ("scale_up_decided_s", "step -> first scale-up", "s"),
    ("capacity_ready_s", "step -> ready capacity >= offered", "s"),
    ("queue_under_target_s", "step -> queue under target", "s"),
    ("carried_s", "step -> load carried", "s"),
    ("back_to_min_s", "step end -> back to min_replicas", "s"),
)


# Figures about scaling decisions, which a subject without autoscaling does not make.
AUTOSCALING_ONLY = ("scale_up_decided_s", "back_to_min_s")


@dataclass(frozen=True)
class StepFigures:
    """One subject's run through the step. Times are seconds after the step began (or ended);
    None is a moment that never came, NaN a figure the subject does not have."""

    requests: int
    ok: int
    refused_503: int
    refused_503_in_step: int
    unanswered: int  # neither a 2xx nor a 503 with Retry-After: must be 0
    unanswered_examples: list[dict[str, Any]]
    idle_p99_ms: float
    step_p50_ms: float
    step_p99_ms: float
    step_ok_rps: float  # answers that arrived within the step
    peak_desired: int
    peak_ready: int
    peak_queued: int
    scale_up_decided_s: float | None
    capacity_ready_s: float | None
    carried_s: float | None
    back_to_min_s: float | None
    queue_under_target_s: float | None


@dataclass(frozen=True)
class SubjectRun:
    subject: str
    repeat: int
    figures: StepFigures
    series: dict[str, list[float]]  # sample by sample, each list as long as "t" (NaN: no figure)
    scale_events: list[dict[str, str | None]]


@dataclass(frozen=True)
class Median:
    """A figure over the repeats: the median (the sum, for a count that must be 0), and each run's."""

    value: float | None  # None: never, in at least half of the repeats
    runs: list[float | None]


def summarise(runs: Sequence[SubjectRun]) -> dict[str, Median]:
    """Medians over repeats; a time that never came (None) counts as +inf, so a median of
    'never' is reported as never rather than dropped."""
    summary: dict[str, Median] = {}
    for key, _, _ in FIGURES:
        values: list[float | None] = [getattr(run.figures, key) for run in runs]
        if key == "unanswered":
            summary[key] = Median(sum(value or 0 for value in values), values)
            continue
        middle = median([math.inf if value is None else float(value) for value in values])
        summary[key] = Median(None if math.isinf(middle) else middle, values)
    return summary


@dataclass(frozen=True)
class StepResult:
    """The load step: both subjects, every repeat; the summary is made from the runs."""

    meta: RunRecord
    options: Options
    runs: dict[str, list[SubjectRun]]  # by subject
    summary: dict[str, dict[str, Median]] = field(init=False)  # by subject, then figure

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", {subject: summarise(runs) for subject, runs in self.runs.items()})


@dataclass(frozen=True)
class CalibrationRow:
    """One batch shape at one utilization: what the replica held, sampled from `/load`."""

    max_batch_size: int
    batch_s: float
    capacity_rps: float
    utilization: float
    rate_rps: float
    served_rps: float
    errors: int
    samples: int
    mean_ongoing: float
    mean_queued: float
    mean_running: float
    first_half_ongoing: float  # growing without bound shows as a second half well above the first
    second_half_ongoing: float
    p50_ms: float
    p99_ms: float
    littles_law_items: float  # items in the system = arrival rate x time in it (a cross-check)
    ongoing_over_batch: float


@dataclass(frozen=True)
class Calibration:
    meta: RunRecord
    duration_s: float
    warmup_s: float
    batch_wait_s: float
    rows: list[CalibrationRow]


@dataclass(frozen=True)
class Results:
    """autoscaling.json: the two modes run separately but report together."""

    step: StepResult | None = None
    calibration: Calibration | None = None
