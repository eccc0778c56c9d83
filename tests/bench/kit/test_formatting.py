"""Every report prints a figure the same way, and a missing one as "-", never as "nan"."""

from __future__ import annotations

import math

import pytest

from batchd.bench.kit.formatting import MISSING, figure, number, share, verdict, with_unit


@pytest.mark.parametrize("missing", [None, math.nan, math.inf, -math.inf])
def test_a_missing_figure_reads_the_same_in_every_formatter(missing: float | None) -> None:
    assert number(missing) == figure(missing) == share(missing) == MISSING == "-"
    assert with_unit(figure(missing), "ms") == "-"  # no unit after nothing


def test_numbers_have_separators_and_fixed_decimals() -> None:
    assert number(1234.5) == "1,234.5"
    assert number(1234.5, 0) == "1,234"
    assert number(0.123456, 3) == "0.123"


def test_figures_keep_decimals_only_where_they_matter() -> None:
    assert figure(1234.4) == "1,234"
    assert figure(156.7) == "157"
    assert figure(56.74) == "56.7"
    assert figure(7.46) == "7.5"
    assert figure(3.0) == "3"  # a count (or a median of counts)
    assert with_unit(figure(12.0), "ms") == "12 ms"


def test_shares_and_verdicts() -> None:
    assert share(0.123) == "12%" and share(0.1234, 1) == "12.3%"
    assert [verdict(True), verdict(False), verdict(None)] == ["met", "**NOT met**", "not measured"]
