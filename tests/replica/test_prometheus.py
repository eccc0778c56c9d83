"""A real Prometheus scrapes a real replica under load: the series a dashboard needs are there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from batchd.testing import ROOT
from batchd.testing.prometheus import Series, prometheus, promtool_check_metrics
from batchd.testing.servers import replica_process

pytestmark = pytest.mark.slow


def positive(series: Series) -> bool:
    return bool(series) and any(float(s["value"][1]) > 0 for s in series)


async def test_prometheus_sees_queue_depth_and_batch_sizes_under_load(tmp_path: Path) -> None:
    # Ray Serve's tutorial adder: 0.2 s a batch of up to 4, so a burst keeps a queue for a few seconds.
    with replica_process(ROOT / "examples" / "adder.yaml", tmp_path) as replica:
        target = replica.url.removeprefix("http://")
        with prometheus([target], tmp_path / "prometheus") as prom:
            async with httpx.AsyncClient(base_url=replica.url, timeout=60) as client:
                burst = asyncio.gather(
                    *(client.post("/v1/models/adder:predict", json={"instances": [n]}) for n in range(60))
                )
                # While the burst is queued, Prometheus sees a queue.
                depth = await asyncio.to_thread(
                    prom.wait_for, 'max_over_time(batchd_queue_depth{deployment="adder"}[1m])', positive
                )
                responses = await burst
            assert all(r.status_code == 200 for r in responses)
            assert depth[0]["metric"]["model"] == "adder"

            # Once Prometheus has scraped every answer, it holds the whole batch-size distribution.
            prom.wait_for(
                'sum(batchd_requests_total{deployment="adder",outcome="success"})',
                lambda series: bool(series) and float(series[0]["value"][1]) >= 60,
            )
            median = prom.query(
                "histogram_quantile(0.5, sum by (le) "
                '(increase(batchd_batch_size_bucket{deployment="adder"}[5m])))'
            )
            assert 1 <= float(median[0]["value"][1]) <= 4
            at_most_four = prom.query('batchd_batch_size_bucket{deployment="adder",le="4.0"}')
            every_batch = prom.query('batchd_batch_size_count{deployment="adder"}')
            assert float(at_most_four[0]["value"][1]) == float(every_batch[0]["value"][1])  # never above max
            assert float(every_batch[0]["value"][1]) < 60  # ... and requests did share batches


def test_the_metrics_pass_promtool(tmp_path: Path) -> None:
    with replica_process(ROOT / "examples" / "adder.yaml", tmp_path) as replica:
        httpx.post(f"{replica.url}/v1/models/adder:predict", json={"instances": [1, 2]}, timeout=30)
        httpx.post(f"{replica.url}/v1/models/adder:predict", json={"instances": ["x"]}, timeout=30)
        exposition = httpx.get(f"{replica.url}/metrics").text
    assert "batchd_batch_size_bucket" in exposition
    assert promtool_check_metrics(exposition) == []
