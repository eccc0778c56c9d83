"""Tracing on real parts: a `batchd serve` process exporting to a real Jaeger, read back through
its query API: 1% sampling samples about 1%. And tracing off imports no OpenTelemetry code.
(`tests/router/test_tracing.py`: a composed request through the router is one trace.)
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from pathlib import Path

import aiohttp
import httpx
import pytest

from batchd.testing.jaeger import StartJaeger
from batchd.testing.manifests import manifest
from batchd.testing.servers import replica_process, write_manifest

pytestmark = pytest.mark.slow

ADDER = "batchd.testing.batch_handlers:add_one"
MARKER_TRACE = "0af7651916cd43dd8448eb211c80319c"


def traceparent(trace_id: str, span_id: str = "b7ad6b7169203331") -> str:
    return f"00-{trace_id}-{span_id}-01"


NO_OPENTELEMETRY = """
import sys, httpx
from batchd.router.cli import start_tracing as start_router_tracing
from batchd.router.app import create_app as create_router
from batchd.router.settings import RouterSettings

assert start_router_tracing() is None
create_router(RouterSettings())
# The router: no OpenTelemetry module at all.
print(sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry"))

from batchd.api.manifest import parse_manifest
from batchd.replica.cli import start_tracing
from batchd.replica.front.app import create_app
from batchd.replica.front.server import replica_protocol
from batchd.replica.settings import ReplicaSettings
from batchd.testing.manifests import manifest
from batchd.testing.servers import uvicorn_in_thread

document = parse_manifest(manifest("adder", "batchd.testing.batch_handlers:add_one"))
assert start_tracing(document) is None
for direct in (True, False):
    app = create_app(document, ReplicaSettings(), tracing=None)
    with uvicorn_in_thread(app, http=replica_protocol(app, access_log=not direct)) as url:
        answer = httpx.post(url + "/v1/models/adder:predict", json={"instances": [1]}, timeout=30)
        assert answer.json() == {"predictions": [2]}, answer.text
# The replica: FastAPI imports OpenTelemetry's API for telemetry of its own (which the replica
# turns off); the SDK, the exporter and batchd's tracing modules stay out.
loaded = [
    name
    for name in sys.modules
    if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.semconv"))
    or name in ("batchd.api.tracing", "batchd.replica.tracing", "batchd.router.tracing")
]
print(sorted(loaded))
"""


def test_tracing_off_imports_no_opentelemetry() -> None:
    """With no OTLP endpoint in the environment, a router made loads no OpenTelemetry module, and a
    replica that answered on both of its paths loads neither the SDK nor the exporter (FastAPI,
    which serves its other routes, imports OpenTelemetry's API itself)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}  # none of the caller's OTEL_* variables
    result = subprocess.run(
        [sys.executable, "-c", NO_OPENTELEMETRY], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    router, replica = result.stdout.strip().splitlines()[-2:]
    assert (router, replica) == ("[]", "[]")


def binomial_bounds(count: int, ratio: float, false_failure: float) -> tuple[int, int]:
    """The fewest and most successes of `count` draws at `ratio` outside which a test fails with
    probability below `false_failure` (each tail half of it), from the exact binomial distribution."""

    def log_pmf(k: int) -> float:
        return (
            math.lgamma(count + 1)
            - math.lgamma(k + 1)
            - math.lgamma(count - k + 1)
            + k * math.log(ratio)
            + (count - k) * math.log1p(-ratio)
        )

    below, low, high = 0.0, 0, count
    for k in range(count + 1):
        below += math.exp(log_pmf(k))
        if below <= false_failure / 2:
            low = k + 1
        if below >= 1 - false_failure / 2:
            high = k
            break
    return low, high


def test_the_binomial_bounds_are_the_tails_asked_for() -> None:
    low, high = binomial_bounds(10_000, 0.01, 1e-6)
    assert (low, high) == (55, 152)


REQUESTS = 10_000


async def send_untraced(url: str, count: int, connections: int = 32) -> list[int]:
    statuses: list[int] = []
    numbers = iter(range(count))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as session:

        async def worker() -> None:
            for n in numbers:
                async with session.post(url, json={"instances": [n]}) as response:
                    await response.read()
                    statuses.append(response.status)

        await asyncio.gather(*(worker() for _ in range(connections)))
    return statuses


def test_sampling_at_one_percent_samples_about_one_percent(start_jaeger: StartJaeger, tmp_path: Path) -> None:
    """10,000 requests with no traceparent to a replica sampling 1%: the traces Jaeger stored lie
    within the binomial bounds that a correct sampler leaves with probability below one in a million."""
    jaeger = start_jaeger()
    batching = {"max_batch_size": 32, "batch_wait_timeout_s": 0.002}
    path = write_manifest(tmp_path, manifest("adder", ADDER, batching=batching))
    env = {**jaeger.environment(sampling_ratio=0.01), "OTEL_SERVICE_NAME": "sampled-adder"}
    with replica_process(path, tmp_path / "logs", env=env) as replica:
        url = f"{replica.url}/v1/models/adder:predict"
        statuses = asyncio.run(send_untraced(url, REQUESTS))
        assert statuses == [200] * REQUESTS
        # A last request its caller sampled: spans leave in order, so once Jaeger holds it, it
        # holds every span sent before it.
        answer = httpx.post(url, json={"instances": [0]}, headers={"traceparent": traceparent(MARKER_TRACE)})
        assert answer.status_code == 200
        jaeger.wait_for_trace(MARKER_TRACE, lambda spans: len(spans) >= 2, "the marker request's trace")
    requests = [
        span
        for trace in jaeger.traces("sampled-adder", limit=REQUESTS)
        for span in trace
        if span.kind == "server" and span.trace_id != MARKER_TRACE
    ]
    low, high = binomial_bounds(REQUESTS, 0.01, 1e-6)
    assert low <= len(requests) <= high, f"{len(requests)} of {REQUESTS} sampled; expected {low} to {high}"
