"""A goal is judged on its figure against its bound, and a figure not measured is never judged."""

from __future__ import annotations

import math

from batchd.bench.kit.goals import at_least, at_most, bullets, median_at_least, table_over_repeats, verdicts


def test_a_goal_is_met_on_its_bound_and_not_judged_without_a_figure() -> None:
    assert at_least("fast", 2.0, 2.0).met is True
    assert at_least("fast", 1.9, 2.0).met is False
    assert at_most("lean", 0.0, 0.0).met is True
    assert at_most("lean", 0.1, 0.0).met is False
    assert at_least("fast", math.nan, 2.0).met is None
    assert bullets([at_least("fast", 3.0, 2.0), at_most("lean", math.nan, 1.0)]) == [
        "- met: fast",
        "- not measured: lean",
    ]


def test_a_goal_over_repeats_is_judged_on_the_median_and_shows_the_range() -> None:
    goal = median_at_least("ratio", [1.0, 3.0, math.nan, 2.5], 2.0)
    assert goal.measured == 2.5 and goal.met is True and verdicts([goal]) == {"ratio": True}
    assert table_over_repeats([goal])[2] == "| ratio | 2.00 | 2.50 | 1.00 to 3.00 | met |"
    assert median_at_least("ratio", [], 2.0).met is None
