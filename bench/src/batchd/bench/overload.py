"""Overload: an open loop at ten times what a replica can serve, and what the replica promises then.

    python -m batchd.bench.overload [--duration 60] [--times 10]

One real replica (`batchd serve`) whose every batch holds the model for a fixed time, so its
capacity is known: max_batch_size / BATCH_S items a second. Its queue holds about one second of
that work (`max_queued_requests`), the bound the README recommends. Requests arrive at `times`
that rate, whatever the answers do, over a keep-alive aiohttp pool. Checked, and reported:
- every answer is a 200, or a 503 or 429 that carries Retry-After; none is lost or reset;
- resident memory stays flat: after the warm-up, its highest sample within 10% of its lowest;
- service is back within a second of the load ending: a request answered 200, in under a second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from batchd.bench import RESULTS_DIR
from batchd.testing import manifests, procstat, servers
from batchd.testing.traffic import Traffic, unanswered

BATCH_S = 0.1
MAX_BATCH = 4
CAPACITY = MAX_BATCH / BATCH_S  # items a second
WARMUP_S = 5.0


def replica_manifest() -> dict[str, Any]:
    model = {"handler": "batchd.testing.handlers:SlowAdder", "init_kwargs": {"delay_s": BATCH_S}}
    batching = {
        "max_batch_size": MAX_BATCH,
        "batch_wait_timeout_s": 0.01,
        "max_queued_requests": int(CAPACITY),  # about a second of work
    }
    return manifests.manifest("overload", model, batching=batching)


async def _sample_memory(
    pid: int, every_s: float, samples: list[tuple[float, int]], stop: asyncio.Event
) -> None:
    started = time.monotonic()
    while not stop.is_set():
        samples.append((time.monotonic() - started, procstat.sample(pid).rss_bytes))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def _recovery_s(url: str, timeout_s: float = 10.0) -> float:
    """From the end of the load until a request is answered 200 in under a second."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
        while time.monotonic() - started < timeout_s:
            sent = time.monotonic()
            response = await client.post("/v1/models/overload:predict", json={"instances": [1]})
            if response.status_code == 200 and time.monotonic() - sent < 1.0:
                return time.monotonic() - started
            await asyncio.sleep(0.02)
    return float("inf")


async def run(duration_s: float, times: float, workdir: Path) -> dict[str, Any]:
    path = servers.write_manifest(workdir, replica_manifest())
    with servers.replica_process(path, workdir) as replica:
        rate = CAPACITY * times
        traffic = Traffic(lambda: [replica.url], "/v1/models/overload:predict", b'{"instances": [1]}', rate)
        memory: list[tuple[float, int]] = []
        stop = asyncio.Event()
        sampling = asyncio.create_task(_sample_memory(replica.pid, 0.5, memory, stop))
        outcomes = await traffic.run(duration_s)
        stop.set()
        await sampling
        recovery_s = await _recovery_s(replica.url)
        replica.check_alive()
    statuses = Counter(str(outcome.status) for outcome in outcomes)
    without_retry_after = sum(1 for o in outcomes if o.status in (429, 503) and o.retry_after is None)
    steady = [rss for at, rss in memory if at >= WARMUP_S] or [rss for _, rss in memory]
    served = statuses.get("200", 0)
    return {
        "capacity_items_per_s": CAPACITY,
        "offered_rate_per_s": rate,
        "duration_s": duration_s,
        "requests": len(outcomes),
        "statuses": dict(statuses),
        "served_per_s": served / duration_s,
        "unanswered": len(unanswered(outcomes)),
        "refusals_without_retry_after": without_retry_after,
        "rss_mib_min": min(steady) / 2**20,
        "rss_mib_max": max(steady) / 2**20,
        "rss_growth": max(steady) / min(steady) - 1,
        "recovery_s": recovery_s,
        "p99_served_ms": _p99([o.latency_s for o in outcomes if o.status == 200]) * 1000,
    }


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def verdicts(report: dict[str, Any]) -> dict[str, bool]:
    """The promises of the module docstring, as checks on a report."""
    allowed = {"200", "429", "503"}
    return {
        "only 200, or 503/429 with Retry-After": set(report["statuses"]) <= allowed
        and report["refusals_without_retry_after"] == 0
        and report["unanswered"] == 0,
        "resident memory flat (within 10% after warm-up)": report["rss_growth"] <= 0.10,
        "full service within a second of the load ending": report["recovery_s"] <= 1.0,
    }


def markdown(report: dict[str, Any]) -> str:
    offered, capacity = report["offered_rate_per_s"], report["capacity_items_per_s"]
    lines = [
        f"Open loop at {offered:.0f} req/s ({offered / capacity:.0f}x capacity, {capacity:.0f} items/s) "
        f"for {report['duration_s']:.0f} s: {report['requests']} requests.",
        "",
        "| measure | value |",
        "|---|---:|",
        *(f"| answered {status} | {count} |" for status, count in sorted(report["statuses"].items())),
        f"| served per second | {report['served_per_s']:.1f} |",
        f"| p99 latency of the 200s | {report['p99_served_ms']:.0f} ms |",
        f"| no usable answer | {report['unanswered']} |",
        f"| 503/429 without Retry-After | {report['refusals_without_retry_after']} |",
        f"| RSS after warm-up, min / max | {report['rss_mib_min']:.1f} / {report['rss_mib_max']:.1f} MiB "
        f"(+{report['rss_growth'] * 100:.1f}%) |",
        f"| back to full service after the load | {report['recovery_s']:.2f} s |",
        "",
        *(f"- {'met' if ok else 'NOT met'}: {what}" for what, ok in verdicts(report).items()),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of overload (default 60)")
    parser.add_argument(
        "--times", type=float, default=10.0, help="load as a multiple of capacity (default 10)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="batchd-overload-") as workdir:
        report = asyncio.run(run(args.duration, args.times, Path(workdir)))
    text = markdown(report)
    print(text)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "overload.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS_DIR / "overload.md").write_text(text)
    return 0 if all(verdicts(report).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
