"""Every report's markdown table: a head, one alignment a column, and the cells as given."""

from __future__ import annotations

import pytest

from batchd.bench.kit.tables import table


def test_names_go_left_and_figures_right_by_default() -> None:
    assert table(["subject", "req/s", "p99 ms"], [["batchd", "1,234", "5.6"], ["floor", "2,000", ""]]) == [
        "| subject | req/s | p99 ms |",
        "|---|---:|---:|",
        "| batchd | 1,234 | 5.6 |",
        "| floor | 2,000 |  |",
    ]


def test_columns_align_as_told_and_a_wrong_count_is_refused() -> None:
    assert table(["repeat", "way in"], [[1, "key"]], align="rl")[1:] == ["|---:|---|", "| 1 | key |"]
    with pytest.raises(ValueError, match="align: expected 2 columns"):
        table(["a", "b"], [], align="l")
