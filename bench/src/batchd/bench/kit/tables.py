"""How every report writes a markdown table: a head, one alignment a column, a row a line.

Figures are right-aligned so that their digits line up; names and words left. The cells come in
already formatted (`formatting`), so that a missing figure reads the same in every table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_RULES = {"l": "---", "r": "---:"}


def table(head: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """The table's lines. `align` gives each column `l` (left) or `r` (right); by default the first
    column is left and every other right (a name, then its figures)."""
    align = align or "l" + "r" * (len(head) - 1)
    if len(align) != len(head):
        raise ValueError(f"align: expected {len(head)} columns, got {align!r}")
    return [
        _line(head),
        "|" + "|".join(_RULES[side] for side in align) + "|",
        *(_line([str(cell) for cell in row]) for row in rows),
    ]


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
