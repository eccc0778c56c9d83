"""The one chart helper writes a PNG and hands every benchmark a 2-D grid of panels."""

from __future__ import annotations

from pathlib import Path

from batchd.bench.kit.charts import panels


def test_panels_write_a_png_with_the_grid_asked_for(tmp_path: Path) -> None:
    path = tmp_path / "chart.png"
    with panels(path, 2, 3, (6, 4)) as (figure, axes):
        assert [len(row) for row in axes] == [3, 3]
        axes[1][2].plot([0, 1], [1, 0])
        figure.suptitle("a title")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_a_single_panel_is_still_a_grid(tmp_path: Path) -> None:
    with panels(tmp_path / "one.png", 1, 1, (3, 3)) as (_, axes):
        assert len(axes) == 1 and len(axes[0]) == 1
    assert (tmp_path / "one.png").stat().st_size > 0
