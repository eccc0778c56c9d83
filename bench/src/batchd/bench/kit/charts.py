"""The one way a benchmark draws: matplotlib without a display, a PNG written, the figure closed.

Each benchmark's chart module draws on the axes this hands it; the file handling, the backend
and the resolution are decided here once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 110


@contextmanager
def panels(
    path: Path, rows: int, columns: int, size: tuple[float, float], **subplots: Any
) -> Iterator[tuple[Figure, list[list[Axes]]]]:
    """A figure of rows x columns panels (always a 2-D grid), written to `path` as a PNG on exit."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(rows, columns, figsize=size, squeeze=False, **subplots)
    try:
        yield figure, [list(row) for row in axes]
        figure.savefig(path, dpi=DPI)
    finally:
        plt.close(figure)
