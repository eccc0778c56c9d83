"""The operator benchmark runs end to end in smoke size: `python -m batchd.operator` in its own
process converges a few resources against a real API server, then polls the stand-in load
endpoints of a few autoscaled ones; the figures are printed and written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchd.bench.kit.command import main
from batchd.bench.operator_bench.__main__ import BENCHMARK
from batchd.bench.operator_bench.load_endpoints import replica_ip, stand_in_load


def test_operator_bench_smoke(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["--quick", "--output-dir", str(tmp_path), "--log", str(tmp_path / "operator.log")]
    assert main(BENCHMARK, argv) == 0
    out = capsys.readouterr().out
    assert "create -> Deployment: median" in out
    assert "5 resources: created in" in out
    assert "operator RSS:" in out
    assert "autoscaling 5 resources x 4 replicas (20 stand-in /load endpoints" in out

    figures = json.loads((tmp_path / "operator.json").read_text())
    auto = figures["autoscaling"]
    assert auto["replicas"] == 20 and auto["poll_interval_s"] == 0.5
    assert auto["replicas_polled"] == 20  # every stand-in replica was asked, in the steady state
    assert auto["polls_per_replica_min"] >= 2
    assert 0 < auto["polls_per_s"] <= 2 * auto["expected_polls_per_s"]
    assert len(auto["windows"]) >= 3
    assert all(window["operator_cores"] >= 0 for window in auto["windows"])
    assert auto["operator_rss_mib"] > 0
    assert auto["status_writes"] >= 0 and "operator_calls" in auto
    assert "| window | operator cores |" in (tmp_path / "operator.md").read_text()


def test_stand_in_load_varies_by_replica_and_over_time() -> None:
    loads = {stand_in_load(replica_ip(i), 0.0) for i in range(50)}
    assert len(loads) > 5
    address = replica_ip(7)
    queued, running = stand_in_load(address, 0.0)
    assert queued >= 0 and 0 <= running <= 8
    assert replica_ip(1999) == "127.200.7.250"
