"""Reading batch sizes and counters from a replica's /metrics text."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from batchd.testing.promtext import parse_counter, parse_histogram

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def exposition(sizes: list[int], other_model: list[int] | None = None) -> str:
    """The text a real prometheus-client exports for these observed batch sizes."""
    registry = CollectorRegistry()
    histogram = Histogram(
        "batchd_batch_size", "Items per batch.", ("deployment", "model"), buckets=BUCKETS, registry=registry
    )
    histogram.labels("minilm", "minilm")  # the series exists from the start, as in the replica
    for size in sizes:
        histogram.labels("minilm", "minilm").observe(size)
    for size in other_model or []:
        histogram.labels("other", "other").observe(size)
    return generate_latest(registry).decode()


def test_histogram_gives_counts_per_bucket_and_the_mean() -> None:
    histogram = parse_histogram(exposition([1, 32, 32, 32, 20, 3]), "batchd_batch_size")
    assert histogram.count == 6
    assert histogram.sum == 120
    assert histogram.mean == 20
    assert histogram.distribution() == {"1": 1, "3-4": 1, "17-32": 4}


def test_difference_between_two_scrapes_is_what_happened_in_between() -> None:
    before = parse_histogram(exposition([1, 1]), "batchd_batch_size")
    after = parse_histogram(exposition([1, 1, 8, 8, 5000]), "batchd_batch_size")
    delta = after.minus(before)
    assert delta.count == 3
    assert delta.distribution() == {"5-8": 2, ">4096": 1}


def test_labels_select_one_deployment() -> None:
    text = exposition([32], other_model=[2, 2])
    assert parse_histogram(text, "batchd_batch_size", {"deployment": "other"}).distribution() == {"2": 2}
    assert parse_histogram(text, "batchd_batch_size").count == 3  # summed when not selected


def test_missing_metric_is_named() -> None:
    with pytest.raises(LookupError, match="batchd_batch_wait_seconds"):
        parse_histogram(exposition([1]), "batchd_batch_wait_seconds")


def test_empty_histogram_has_no_mean() -> None:
    assert math.isnan(parse_histogram(exposition([]), "batchd_batch_size").mean)


def test_counter_value() -> None:
    registry = CollectorRegistry()
    requests = Counter("batchd_requests", "Requests.", ("outcome",), registry=registry)
    requests.labels("success").inc(7)
    requests.labels("error").inc(2)
    text = generate_latest(registry).decode()
    assert parse_counter(text, "batchd_requests", {"outcome": "success"}) == 7
    assert parse_counter(text, "batchd_requests") == 9
