"""The Prometheus test harness itself, against a tiny prometheus-client exporter: it scrapes, it
answers PromQL, it reports bad PromQL and unmet waits, and promtool's lint finds real problems."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from batchd.testing.prometheus import StartPrometheus, promtool_check_metrics
from batchd.testing.prometheus import start_prometheus as start_prometheus  # the fixture
from batchd.testing.servers import free_port


@pytest.fixture
def exporter() -> Iterator[tuple[str, Gauge, Counter]]:
    registry = CollectorRegistry()
    depth = Gauge("demo_queue_depth", "Items waiting.", ["deployment", "instance"], registry=registry)
    served = Counter("demo_requests", "Requests served.", registry=registry)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{port}", depth, served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.slow  # a real Prometheus process
def test_prometheus_scrapes_what_the_exporter_sets(
    exporter: tuple[str, Gauge, Counter], start_prometheus: StartPrometheus
) -> None:
    target, depth, served = exporter
    depth.labels(deployment="adder", instance="pod-a").set(7)
    prom = start_prometheus([target], job="demo")
    series = prom.wait_for("demo_queue_depth", lambda s: bool(s))
    # honor_labels: the exporter's own `instance` label is kept, not replaced by host:port.
    assert series[0]["metric"] | {} == {
        "__name__": "demo_queue_depth",
        "deployment": "adder",
        "instance": "pod-a",
        "job": "demo",
    }
    assert series[0]["value"][1] == "7"

    served.inc(5)
    prom.wait_for("demo_requests_total", lambda s: bool(s) and s[0]["value"][1] == "5")
    assert prom.query("vector(1) + 1")[0]["value"][1] == "2"


@pytest.mark.slow  # a real Prometheus process
def test_bad_promql_and_unmet_waits_fail_loudly(
    exporter: tuple[str, Gauge, Counter], start_prometheus: StartPrometheus
) -> None:
    prom = start_prometheus([exporter[0]])
    with pytest.raises(ValueError, match="bad_data"):
        prom.query("sum(rate(demo_requests_total[1m])")
    with pytest.raises(TimeoutError, match="never satisfied"):
        prom.wait_for("no_such_metric", lambda s: bool(s), timeout_s=2)


@pytest.mark.slow  # promtool comes with Debian's prometheus, which `make test` installs, not `make test-fast`
def test_promtool_finds_what_is_wrong_with_an_exposition() -> None:
    good = "# HELP demo_requests_total Requests.\n# TYPE demo_requests_total counter\ndemo_requests_total 1\n"
    assert promtool_check_metrics(good) == []
    bad = "# HELP demo_requests Requests.\n# TYPE demo_requests counter\ndemo_requests 1\n"
    problems = promtool_check_metrics(bad)
    assert any("_total" in problem for problem in problems), problems
