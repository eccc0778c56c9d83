"""What autoscaling.json holds (frozen dataclasses), and how a subject's run becomes it: the
series sample by sample, and the moments that matter after the step began and ended."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from batchd.bench.autoscaling.workload import Options
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.stats import median, p99_ms, percentile
from batchd.testing.traffic import Outcome, unanswered

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
class Results:
    """autoscaling.json: the load step (None: not run)."""

    step: StepResult | None = None


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the traffic started
    desired: int  # the Deployment's spec.replicas: what the operator asked for
    ready: int  # pods Ready and not terminating: what kube-proxy sends traffic to
    queued: int  # sum of queued_items over the ready replicas that answered /load
    running: int  # sum of running_items over the same


def series(
    options: Options, samples: Sequence[Sample], outcomes: Sequence[Outcome]
) -> dict[str, list[float]]:
    """Per sample: the offered rate, what was sent and served (last second), and the windowed p99.

    Latency counts only requests answered 200: a 503 is answered at once, and counting it would
    make an overloaded replica look fast. Requests belong to the moment they were sent.
    """
    ok = sorted((o.sent_s, o.latency_s) for o in outcomes if o.status == 200)
    sent = sorted(o.sent_s for o in outcomes)
    done = sorted(o.sent_s + o.latency_s for o in outcomes if o.status == 200)
    refused = sorted(o.sent_s for o in outcomes if o.status == 503)
    result: dict[str, list[float]] = {
        key: [] for key in ("t", "offered_rps", "sent_rps", "ok_rps", "refused_rps", "p99_ms")
    }
    ok_sent = [s for s, _ in ok]

    def last_second(times: list[float], t: float) -> int:
        return bisect.bisect_right(times, t) - bisect.bisect_right(times, t - 1)

    for sample in samples:
        t = sample.t
        result["t"].append(round(t, 3))
        result["offered_rps"].append(options.step.rate(t))
        result["sent_rps"].append(last_second(sent, t))
        result["ok_rps"].append(last_second(done, t))
        result["refused_rps"].append(last_second(refused, t))
        lo, hi = bisect.bisect_right(ok_sent, t - options.window_s), bisect.bisect_right(ok_sent, t)
        result["p99_ms"].append(p99_ms([latency for _, latency in ok[lo:hi]]))
    for key in ("desired", "ready", "queued", "running"):
        result[key] = [getattr(sample, key) for sample in samples]
    return result


def first_at_or_after(times: Sequence[float], flags: Sequence[bool], since: float) -> float | None:
    for t, flag in zip(times, flags, strict=True):
        if t >= since and flag:
            return t - since
    return None


def held_from(times: Sequence[float], flags: Sequence[bool], since: float, until: float) -> float | None:
    """Seconds from `since` to the first time after which `flags` holds at every sample up to `until`."""
    first: float | None = None
    for t, flag in zip(times, flags, strict=True):
        if t < since or t > until:
            continue
        if not flag:
            first = None
        elif first is None:
            first = t
    return None if first is None else first - since


def analyse(
    subject: str,
    options: Options,
    samples: Sequence[Sample],
    outcomes: Sequence[Outcome],
    scale_events: list[dict[str, str | None]],
    repeat: int = 0,
) -> SubjectRun:
    step = options.step
    data = series(options, samples, outcomes)
    times = data["t"]

    def latencies(since: float, until: float) -> list[float]:
        return [o.latency_s for o in outcomes if o.status == 200 and since <= o.sent_s < until]

    idle_p99 = p99_ms(latencies(1.0, step.start_s))  # the first second opens connections
    threshold = options.carry_factor * idle_p99
    under = [not math.isnan(p) and p <= threshold for p in data["p99_ms"]]
    enough = [ready * options.capacity_rps >= step.high_rps for ready in data["ready"]]
    # The autoscaler's own aim: each ready replica holds no more than target_ongoing_items queued.
    short = [
        queued <= options.max_batch_size * ready
        for queued, ready in zip(data["queued"], data["ready"], strict=True)
    ]
    lost = unanswered(outcomes)
    in_step = [o for o in outcomes if step.start_s <= o.sent_s < step.end_s]
    at_min = [
        desired == options.min_replicas and ready == options.min_replicas
        for desired, ready in zip(data["desired"], data["ready"], strict=True)
    ]
    step_latencies = latencies(step.start_s, step.end_s)
    figures = StepFigures(
        requests=len(outcomes),
        ok=sum(o.status == 200 for o in outcomes),
        refused_503=sum(o.status == 503 for o in outcomes),
        refused_503_in_step=sum(o.status == 503 for o in in_step),
        unanswered=len(lost),
        unanswered_examples=[asdict(o) for o in lost[:5]],
        idle_p99_ms=idle_p99,
        step_p50_ms=percentile(step_latencies, 50) * 1000,
        step_p99_ms=p99_ms(step_latencies),
        # Answers that arrived within the step (a backlog answered later belongs to later).
        step_ok_rps=sum(
            o.status == 200 and step.start_s <= o.sent_s + o.latency_s < step.end_s for o in outcomes
        )
        / step.step_s,
        peak_desired=max((sample.desired for sample in samples), default=0),
        peak_ready=max((sample.ready for sample in samples), default=0),
        peak_queued=max((sample.queued for sample in samples), default=0),
        # Seconds after the step began: the first larger ask, enough ready capacity, carried.
        scale_up_decided_s=first_at_or_after(times, [d > 1 for d in data["desired"]], step.start_s),
        capacity_ready_s=first_at_or_after(times, enough, step.start_s),
        carried_s=held_from(times, under, step.start_s, step.end_s),
        # Seconds after the step ended until the count is back at min_replicas (and stays).
        back_to_min_s=held_from(times, at_min, step.end_s, step.duration_s + 1)
        if subject == "autoscaled"
        else math.nan,
        queue_under_target_s=held_from(times, short, step.start_s, step.end_s),
    )
    return SubjectRun(subject, repeat, figures, data, scale_events)
