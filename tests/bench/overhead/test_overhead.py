"""The overhead benchmark's own parts: what it counts as a server's CPU, the medians and ratios it
reports, and the options it refuses."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from batchd.bench.kit.processtree import tree_cpu_s
from batchd.bench.overhead import subjects
from batchd.bench.overhead.analysis import ratios, summarise
from batchd.bench.overhead.results import Measurement
from tests.bench.conftest import RunModule

# A child that spends this much CPU, then says so and waits for its stdin to close.
BURN_S = 0.3
CHILD = (
    "import sys, time\n"
    f"while time.process_time() < {BURN_S}: pass\n"
    "print('burnt', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_a_servers_cpu_counts_its_child_processes() -> None:
    """Mosec answers in one process and runs the model in another: both are the server's CPU."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "burnt"  # bounded: the child exits past BURN_S of CPU
        own = time.process_time()
        assert tree_cpu_s(os.getpid()) >= own + BURN_S - 0.05  # /proc counts in 10 ms ticks
    finally:
        child.communicate(timeout=30)


def _run(subject: str, repeat: int, rps: float, cpu_ms: float) -> Measurement:
    requests = int(rps * 5)
    return Measurement(subject, repeat, requests, 0, rps, 10.0, 40.0, cpu_ms * requests / 1000, 1.0)


def test_medians_over_repeats_and_ratios_against_each_reference() -> None:
    runs = [
        _run("batchd", 0, 5000, 0.05),
        _run("mosec", 0, 4000, 0.10),
        _run("batchd", 1, 1000, 0.50),  # a slow minute: the median leaves it out
        _run("mosec", 1, 4000, 0.10),
        _run("batchd", 2, 6000, 0.06),
        _run("mosec", 2, 4000, 0.10),
    ]
    summaries = summarise(runs)
    assert [s.subject for s in summaries] == ["batchd", "mosec"]
    assert summaries[0].throughput_rps == 5000
    assert summaries[0].server_cpu_ms_per_request == pytest.approx(0.06)
    pair = ratios(summaries)["batchd/mosec"]
    assert pair["throughput_rps"] == pytest.approx(1.25)
    assert pair["server_cpu_ms_per_request"] == pytest.approx(0.6)
    assert "batchd/bare" not in ratios(summaries)  # only what ran is compared


def test_a_baseline_without_its_source_tree_is_refused_by_name(run_module: RunModule) -> None:
    done = run_module("batchd.bench.overhead", "--subjects", "batchd", "baseline", timeout_s=60)
    assert done.returncode == 2
    assert "--subjects: baseline needs --baseline-src" in done.stderr


@pytest.mark.slow
def test_the_minimal_server_answers_each_request_in_batches_as_the_replica_would(tmp_path: Path) -> None:
    server = subjects.start(subjects.MINIMAL, tmp_path, cores=None)
    try:
        server.wait_ready(60)

        async def ask_all() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                asks = [client.post(subjects.REPLICA_PATH, json={"instances": [n]}) for n in range(40)]
                return await asyncio.gather(*asks)

        answers = asyncio.run(ask_all())
        assert [a.json() for a in answers] == [{"predictions": [n + 1]} for n in range(40)]
    finally:
        server.stop()
