"""A real Jaeger (v2: an OpenTelemetry Collector with Jaeger's storage and query) for the tracing
tests and benchmark: spans go in through its OTLP/HTTP receiver, and the tests read back what it
stored through its query API (`/api/traces`), as a person would through the Jaeger UI.

The binary is built from its Go module by `tools/build-jaeger.sh` (`make jaeger`) into
~/.cache/batchd, as the Kubernetes binaries are; it runs with its in-memory store, on free ports
of the address given (loopback, or the test cluster's own address where pods must reach it).

Any test gets the `start_jaeger` fixture with `pytest_plugins = ["batchd.testing.jaeger"]`
(tests/conftest.py does).
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from batchd.testing import ROOT
from batchd.testing.servers import free_port, wait_until
from batchd.testing.waiting import NotYet, answers_ok, eventually

BUILD_SCRIPT = ROOT / "tools" / "build-jaeger.sh"

# Jaeger's JSON for a span's references: its parent, and (OpenTelemetry links) the spans it follows.
CHILD_OF = "CHILD_OF"
FOLLOWS_FROM = "FOLLOWS_FROM"


@functools.cache
def jaeger_binary() -> str:
    """The Jaeger binary, built first if it is not in the cache yet (`make jaeger` does that
    outside the tests' time)."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class Span:
    """One span as Jaeger's query API returns it, with its service and its tags as a dict."""

    trace_id: str
    span_id: str
    name: str
    service: str
    kind: str  # server, client, internal
    parent: str | None  # the CHILD_OF reference's span id
    links: tuple[tuple[str, str], ...]  # (trace id, span id) of each FOLLOWS_FROM reference
    tags: dict[str, Any]
    events: tuple[dict[str, Any], ...]

    @classmethod
    def of(cls, raw: dict[str, Any], processes: dict[str, Any]) -> Span:
        tags = {tag["key"]: tag["value"] for tag in raw.get("tags", [])}
        references = raw.get("references") or []
        parent = next((r["spanID"] for r in references if r["refType"] == CHILD_OF), None)
        links = tuple((r["traceID"], r["spanID"]) for r in references if r["refType"] == FOLLOWS_FROM)
        events = tuple(
            {field["key"]: field["value"] for field in log["fields"]} for log in raw.get("logs") or []
        )
        return cls(
            raw["traceID"],
            raw["spanID"],
            raw["operationName"],
            processes[raw["processID"]]["serviceName"],
            str(tags.get("span.kind", "internal")),
            parent,
            links,
            tags,
            events,
        )


@dataclass
class Jaeger:
    """A running Jaeger: where spans go (`otlp_endpoint`, the base URL an OTEL_EXPORTER_OTLP_ENDPOINT
    names) and where its query API answers (`query_url`, the UI's address)."""

    otlp_endpoint: str
    query_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def environment(self, sampling_ratio: float = 1.0) -> dict[str, str]:
        """The OpenTelemetry variables of a process that sends its spans here; they leave within
        a tenth of a second (OTEL_BSP_SCHEDULE_DELAY, 5 s by default), so that tests wait little."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.otlp_endpoint,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": format(sampling_ratio, "g"),
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }

    def services(self) -> list[str]:
        answer = httpx.get(f"{self.query_url}/api/services", timeout=10).json()
        return sorted(answer.get("data") or [])

    def traces(self, service: str, limit: int = 1000) -> list[list[Span]]:
        """The traces holding spans of `service` (up to `limit`), each as its spans."""
        params: dict[str, str | int] = {"service": service, "limit": limit, "lookback": "1h"}
        answer = httpx.get(f"{self.query_url}/api/traces", params=params, timeout=30).json()
        return [_spans(raw) for raw in answer.get("data") or []]

    def trace(self, trace_id: str) -> list[Span]:
        """Every span of one trace; [] while Jaeger has none of it."""
        response = httpx.get(f"{self.query_url}/api/traces/{trace_id}", timeout=30)
        if response.status_code == 404:
            return []
        response.raise_for_status()
        data = response.json().get("data") or []
        return _spans(data[0]) if data else []

    def wait_for_trace(
        self, trace_id: str, holds: Callable[[list[Span]], bool], what: str, timeout_s: float = 30
    ) -> list[Span]:
        """The trace, once what Jaeger stored of it satisfies `holds` (spans arrive batch by batch)."""

        def probe() -> list[Span] | NotYet:
            spans = self.trace(trace_id)
            return spans if spans and holds(spans) else NotYet(_describe(spans))

        return eventually(probe, what=what, timeout_s=timeout_s, interval_s=0.2)


def _spans(raw: dict[str, Any]) -> list[Span]:
    processes = raw.get("processes") or {}
    return [Span.of(span, processes) for span in raw["spans"]]


def _describe(spans: list[Span]) -> str:
    return "; ".join(f"{span.service}: {span.name} ({span.kind})" for span in spans) or "no span"


def _config(host: str, ports: dict[str, int]) -> dict[str, Any]:
    """Jaeger's all-in-one configuration, cut to what the tests use: OTLP/HTTP in, the memory
    store, the query API; its own telemetry off (it would take fixed ports)."""
    return {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["jaeger_storage_exporter"],
                }
            },
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
        },
        "extensions": {
            "healthcheckv2": {"use_v2": True, "http": {"endpoint": f"{host}:{ports['health']}"}},
            "jaeger_query": {
                "storage": {"traces": "memstore"},
                "http": {"endpoint": f"{host}:{ports['query']}"},
                "grpc": {"endpoint": f"{host}:{ports['query_grpc']}"},
            },
            "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": 100_000}}}},
        },
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"{host}:{ports['otlp']}"}}}},
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
    }


@contextmanager
def jaeger(directory: Path, host: str = "127.0.0.1") -> Iterator[Jaeger]:
    """Jaeger listening on free ports of `host`; yields once its receiver and query API answer."""
    ports = {name: free_port(host) for name in ("otlp", "query", "query_grpc", "health")}
    directory.mkdir(parents=True, exist_ok=True)
    config_path = directory / "jaeger.yaml"
    config_path.write_text(yaml.safe_dump(_config(host, ports)))
    log_path = directory / "jaeger.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [jaeger_binary(), "--config", f"file:{config_path}"], stdout=log, stderr=subprocess.STDOUT
        )
    server = Jaeger(f"http://{host}:{ports['otlp']}", f"http://{host}:{ports['query']}", process, log_path)
    health = f"http://{host}:{ports['health']}/status"
    try:
        wait_until(lambda: process.poll() is not None or answers_ok(health), 60, "jaeger ready")
        if process.poll() is not None:
            raise RuntimeError(f"jaeger exited with {process.returncode}:\n{log_path.read_text()}")
        yield server
    finally:
        process.kill()  # its store is memory: nothing to save, and a graceful stop takes seconds
        process.wait(timeout=30)


StartJaeger = Callable[..., Jaeger]


@pytest.fixture
def start_jaeger(tmp_path: Path) -> Iterator[StartJaeger]:
    """`start_jaeger(host="127.0.0.1")` -> a running Jaeger, stopped after the test."""
    with ExitStack() as stack:
        started: list[Jaeger] = []

        def start(host: str = "127.0.0.1") -> Jaeger:
            server = stack.enter_context(jaeger(tmp_path / f"jaeger-{len(started)}", host))
            started.append(server)
            return server

        yield start
