"""Reading a server's own `/metrics`: the batch-size histogram and the counters, as the server saw
them.

Tests and benchmarks quote batch sizes from the server rather than guessing them from the client
side, so the numbers are the ones an operator would see in Grafana. A replica serves many runs in a
row, so the useful figure is the difference between two scrapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Histogram:
    """One histogram series: cumulative counts by upper bound, plus its sum and count."""

    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), ascending, +Inf last
    sum: float
    count: float

    def minus(self, earlier: Histogram) -> Histogram:
        """What happened between two scrapes of the same series."""
        if [le for le, _ in self.buckets] != [le for le, _ in earlier.buckets]:
            raise ValueError("histograms with different buckets cannot be subtracted")
        buckets = tuple((le, c - e) for (le, c), (_, e) in zip(self.buckets, earlier.buckets, strict=True))
        return Histogram(buckets, self.sum - earlier.sum, self.count - earlier.count)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    def distribution(self) -> dict[str, int]:
        """Observations per bucket, labelled by range ("1", "2", "3-4", "5-8" ...) for integer data."""
        result: dict[str, int] = {}
        previous_le = 0.0
        previous_count = 0.0
        for le, cumulative in self.buckets:
            in_bucket = round(cumulative - previous_count)
            if in_bucket:
                result[_bucket_label(previous_le, le)] = in_bucket
            previous_le, previous_count = le, cumulative
        return result


def _bucket_label(low: float, high: float) -> str:
    if math.isinf(high):
        return f">{int(low)}"
    first = math.floor(low) + 1
    last = int(high)
    return str(last) if first >= last else f"{first}-{last}"


def parse_histogram(text: str, name: str, labels: dict[str, str] | None = None) -> Histogram:
    """The histogram `name` (base name, no `_bucket`) in Prometheus text; summed over label sets that
    match `labels`. Raises LookupError naming the metric when it is absent."""
    wanted = labels or {}
    buckets: dict[float, float] = {}
    total = 0.0
    count = 0.0
    found = False
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if any(sample.labels.get(k) != v for k, v in wanted.items()):
                continue
            found = True
            if sample.name == f"{name}_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == f"{name}_sum":
                total += sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
    if not found:
        raise LookupError(f"metric {name!r} with labels {wanted} not found in /metrics")
    return Histogram(tuple(sorted(buckets.items())), total, count)


def parse_counter(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """A counter's value (summed over matching label sets); `name` without the `_total` suffix."""
    wanted = labels or {}
    value = 0.0
    found = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:  # the family's name varies with the exposition format
            if sample.name == f"{name}_total" and all(sample.labels.get(k) == v for k, v in wanted.items()):
                value += sample.value
                found = True
    if not found:
        raise LookupError(f"metric {name!r} with labels {wanted} not found in /metrics")
    return value


def gauge(text: str, name: str) -> float:
    """A gauge's value; NaN when absent (a server exports only the figures it uses)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return math.nan


def histogram_delta(after: str, before: str, name: str) -> Histogram:
    """What a histogram counted between two scrapes."""
    return parse_histogram(after, name).minus(parse_histogram(before, name))


def counter_delta(after: str, before: str, name: str) -> float:
    """What a counter counted between two scrapes; NaN when the server does not export it."""
    try:
        return parse_counter(after, name) - parse_counter(before, name)
    except LookupError:
        return math.nan
