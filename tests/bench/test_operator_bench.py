"""The operator benchmark runs end to end (a few resources): `python -m batchd.operator` in its own
process converges them against the emulated API server, and the figures are printed."""

from __future__ import annotations

import pytest

from batchd.bench import operator_bench


def test_operator_bench_smoke(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    assert (
        operator_bench.main(["--repeats", "2", "--resources", "5", "--log", f"{tmp_path}/operator.log"]) == 0
    )
    out = capsys.readouterr().out
    assert "create -> Deployment: median" in out
    assert "5 resources: created in" in out
    assert "operator RSS:" in out
