"""Interleaved repeats: on a small shared machine nothing is measured once, and the subjects take
turns within each repeat, so that a slow minute falls on all of them alike.

So a subject is compared with its baseline within each repeat (the two ran minutes apart, in the
same conditions), and the median of those comparisons is quoted, rather than a ratio of medians
from different minutes; each figure of a subject is its median over the repeats.
"""

from __future__ import annotations

import dataclasses
import typing
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from batchd.bench.kit.stats import median, ratio

T = TypeVar("T")
R = TypeVar("R")
# Of the error samples of every repeat, a summary keeps this many.
ERROR_SAMPLES = 3


def rotated(subjects: Sequence[T], repeat: int) -> list[T]:
    """The order of one repeat: who goes first turns with every repeat, so that no subject always
    runs right after the same neighbour."""
    shift = repeat % len(subjects) if subjects else 0
    return [*subjects[shift:], *subjects[:shift]]


def interleaved(subjects: Sequence[T], repeats: int) -> Iterator[tuple[int, T]]:
    """(repeat, subject): every subject once a repeat, in an order that turns (`rotated`)."""
    for repeat in range(repeats):
        for subject in rotated(subjects, repeat):
            yield repeat, subject


def within_repeats(
    runs: Iterable[R],
    key: Callable[[R], tuple[Hashable, int]],
    subject: Hashable,
    baseline: Hashable,
    figure: Callable[[R], float],
    compare: Callable[[float, float], float] = ratio,
) -> list[float]:
    """In each repeat where both ran, `compare(figure(subject's run), figure(baseline's))`; `key`
    says whose run a run is and of which repeat."""
    by_key = {key(run): figure(run) for run in runs}
    return [
        compare(value, by_key[(baseline, repeat)])
        for (who, repeat), value in by_key.items()
        if who == subject and (baseline, repeat) in by_key
    ]


def median_over_repeats(runs: Sequence[R]) -> R:
    """One subject's repeats as one: each float the median over the repeats (NaN ignored), each
    count summed, its name kept, counts by outcome summed outcome by outcome, the first few error
    samples; a nested figure likewise."""
    kind = type(runs[0])
    hints = typing.get_type_hints(kind)
    merged: dict[str, Any] = {}
    for field in dataclasses.fields(kind):  # type: ignore[arg-type]
        values = [getattr(run, field.name) for run in runs]
        merged[field.name] = _merge(hints[field.name], values)
    return kind(**merged)


def _merge(kind: Any, values: list[Any]) -> Any:
    if kind is str:  # a name: the same in every repeat
        if len(set(values)) > 1:
            raise ValueError(f"repeats of different subjects: {sorted(set(values))}")
        return values[0]
    if kind is float:
        return median(values)
    if kind is int:
        return sum(values)
    if dataclasses.is_dataclass(kind):
        return median_over_repeats(values)
    if kind == list[str]:  # error samples
        return [item for value in values for item in value][:ERROR_SAMPLES]
    if kind == dict[str, int]:  # counts by outcome
        return dict(sum((Counter(value) for value in values), Counter()))
    raise TypeError(f"no median over repeats of a {kind}")
