"""Subjects take turns within each repeat, a subject is compared with its baseline within each
repeat, and its repeats summarise as one: floats by their median, counts summed."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

from batchd.bench.kit.repeats import interleaved, median_over_repeats, rotated, within_repeats


@dataclass(frozen=True)
class Latency:
    p99_ms: float


@dataclass(frozen=True)
class Run:
    subject: str
    rps: float
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    routes: dict[str, int] = field(default_factory=dict)
    latency: Latency = Latency(math.nan)


def test_who_goes_first_turns_with_every_repeat() -> None:
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert list(interleaved(["a", "b"], 2)) == [(0, "a"), (0, "b"), (1, "b"), (1, "a")]


@dataclass(frozen=True)
class Round:
    subject: str
    repeat: int
    rps: float


def test_a_subject_is_compared_with_its_baseline_in_the_same_repeat_only() -> None:
    rounds = [Round("on", 0, 20.0), Round("off", 0, 10.0), Round("on", 1, 9.0), Round("off", 2, 3.0)]
    key, rps = operator.attrgetter("subject", "repeat"), operator.attrgetter("rps")
    assert within_repeats(rounds, key, "on", "off", rps) == [2.0]
    assert within_repeats(rounds, key, "on", "off", rps, operator.sub) == [10.0]


def test_repeats_summarise_as_medians_and_sums() -> None:
    runs = [
        Run("on", 10.0, 1, ["a", "b"], {"hit": 2}, Latency(5.0)),
        Run("on", math.nan, 0, ["c", "d"], {"hit": 1, "miss": 1}, Latency(7.0)),
        Run("on", 30.0, 2, [], {"miss": 1}, Latency(6.0)),
    ]
    merged = median_over_repeats(runs)
    assert merged.subject == "on" and merged.rps == 20.0 and merged.errors == 3
    assert merged.error_samples == ["a", "b", "c"] and merged.routes == {"hit": 3, "miss": 2}
    assert merged.latency == Latency(6.0)
