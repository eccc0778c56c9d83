"""The one way a benchmark states a goal and checks it: a name a reader understands, the figure
measured, the bound it is held to, and whether it was met.

A figure that could not be measured (NaN) is never judged: its goal is "not measured", neither
met nor missed. Goals are checked and reported, not failed on: a run that misses one still writes
its figures, and the reader sees by how much.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from batchd.bench.kit.formatting import number, verdict
from batchd.bench.kit.stats import median


@dataclass(frozen=True)
class Goal:
    name: str
    measured: float  # NaN: not measured
    bound: float
    met: bool | None  # None: not measured
    # Where the goal is on a median over repeats, the figure in each (the report shows its range).
    repeats: tuple[float, ...] = ()
    detail: str = ""  # what the figure is of, where the name cannot say it (the closest peer, say)


def at_least(name: str, measured: float, bound: float, *, detail: str = "") -> Goal:
    return Goal(name, measured, bound, None if math.isnan(measured) else measured >= bound, detail=detail)


def at_most(name: str, measured: float, bound: float, *, detail: str = "") -> Goal:
    return Goal(name, measured, bound, None if math.isnan(measured) else measured <= bound, detail=detail)


def median_at_least(name: str, repeats: Sequence[float], bound: float) -> Goal:
    """A figure taken in each repeat (a ratio within it, say), judged on its median."""
    measured = median(repeats)
    return Goal(name, measured, bound, None if math.isnan(measured) else measured >= bound, tuple(repeats))


def bullets(goals: Iterable[Goal]) -> list[str]:
    """`- met: <name>`, a line a goal."""
    return [f"- {verdict(goal.met)}: {goal.name}" for goal in goals]


def table(goals: Iterable[Goal]) -> list[str]:
    """A row a goal: its bound, the figure measured (with its detail), and the verdict."""
    lines = ["| goal | measured | |", "|---|---:|---|"]
    for goal in goals:
        detail = f" ({goal.detail})" if goal.detail else ""
        lines.append(f"| {goal.name} | {number(goal.measured, 2)}{detail} | {verdict(goal.met)} |")
    return lines


def table_over_repeats(goals: Iterable[Goal]) -> list[str]:
    """A row a goal judged on a median over repeats: its bound, the median and the range."""
    lines = ["| goal | target | measured (median) | lowest to highest repeat | |", "|---|---:|---:|---|---|"]
    for goal in goals:
        clean = [value for value in goal.repeats if not math.isnan(value)]
        spread = f"{number(min(clean), 2)} to {number(max(clean), 2)}" if clean else "-"
        lines.append(
            f"| {goal.name} | {number(goal.bound, 2)} | {number(goal.measured, 2)} | {spread} "
            f"| {verdict(goal.met)} |"
        )
    return lines


def verdicts(goals: Iterable[Goal]) -> dict[str, bool | None]:
    """Whether each goal was met, by name: what a test or a summary reads of them."""
    return {goal.name: goal.met for goal in goals}
