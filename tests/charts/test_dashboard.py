"""The Grafana dashboard: every panel's PromQL returns data from a real Prometheus.

Prometheus scrapes a replica pod (Ray Serve's tutorial adder) under load on a real cluster, the real
operator that manages its BatchedDeployment (on the chart's ServiceAccount), and a real
text-generation replica (a tiny GPT-2, token-level batching; a process of this machine, as the
model is built in the test's folder) that generates text meanwhile, for the generation panels. A
panel whose query names a metric none of them exports comes back empty, and fails.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchd.api.pod import REPLICA_METRICS_PORT, REPLICA_PORT
from batchd.testing.helm import CHART
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import installed
from batchd.testing.manifests import manifest
from batchd.testing.models import build_gpt2
from batchd.testing.prometheus import Series, prometheus
from batchd.testing.servers import ServerProcess, free_port, start_replica, write_manifest
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow

DASHBOARD = json.loads((CHART / "dashboards" / "batchd.json").read_text())
# What Grafana substitutes before it queries: every deployment, and a rate window.
GRAFANA_VARIABLES = {"$deployment": ".*", "$__rate_interval": "1m", "${datasource}": ""}


def panel_queries() -> list[tuple[str, str]]:
    queries = []
    for panel in DASHBOARD["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            queries.append((panel["title"], expr))
    return queries


def test_the_dashboard_is_well_formed() -> None:
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids)) and DASHBOARD["uid"] == "batchd"
    titles = " ".join(panel["title"].lower() for panel in DASHBOARD["panels"])
    for wanted in (
        "queue depth",
        "batch size",
        "wait",
        "execution",
        "outcome",
        "latency",
        "rejections",
        "ready",
        "autoscaler",
        "scale decisions",
        "batching revision",
        "first token",
        "output token",
        "generated tokens",
        "running and waiting sequences",
        "kv cache",
        "adaptive batching",
        "latency objective",
        "priority classes",
        "fairness",
        "rollout",
        "prefix cache",
    ):
        assert wanted in titles
    assert all(not re.search(r"\$\w", expr) for _, expr in panel_queries()), "an unsubstituted variable"


def has_data(series: Series) -> bool:
    return bool(series)


@pytest.fixture
def generator(tmp_path: Path) -> Iterator[ServerProcess]:
    """A tiny GPT-2 replica (token-level batching), loading while the cluster comes up."""
    gpt2 = {
        "task": "text-generation",
        "source": f"file://{build_gpt2(tmp_path / 'tiny-gpt2')}",
        "device": "cpu",
    }
    document = manifest("gpt2", gpt2, batching={"max_batch_size": 4})
    process = start_replica(write_manifest(tmp_path / "gpt2", document), tmp_path / "gpt2")
    try:
        yield process
    finally:
        process.stop()


async def test_every_panel_returns_data_from_a_replica_under_load(
    control_plane: ControlPlane, kube_node: Node, tmp_path: Path, generator: ServerProcess
) -> None:
    metrics_port = free_port()
    operator_env = {
        "BATCHD_METRICS_PORT": str(metrics_port),
        "BATCHD_REPLICA_POLL_INTERVAL_S": "0.2",
        "BATCHD_DRAIN_DELAY_S": "0",
    }
    with (
        installed(control_plane, tmp_path, {"router": {"enabled": False}}) as release,
        release.operator(tmp_path / "operator.log", env=operator_env),
    ):
        # Ray Serve's tutorial adder (0.2 s a batch of up to 4), autoscaled and with a latency objective
        # (adaptive batching), in a replica pod.
        batching = {"max_batch_size": 4, "latency_objective_s": 1.0}
        release.apply(manifest("adder", autoscaling={"max_replicas": 2}, batching=batching))
        (pod,) = await asyncio.to_thread(
            eventually, lambda: release.pods("adder", ready=True), timeout_s=90, what="a ready replica pod"
        )
        url = f"http://{pod['status']['podIP']}:{REPLICA_PORT}"
        await asyncio.to_thread(
            eventually,
            lambda: (
                "batchd_operator_replica_load{" in httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
            ),
            what="the operator to export the load it read",
        )
        await asyncio.to_thread(generator.wait_ready, 180)
        targets = [
            f"{pod['status']['podIP']}:{REPLICA_METRICS_PORT}",  # /metrics has a port of its own
            f"127.0.0.1:{metrics_port}",
            generator.url.removeprefix("http://"),
        ]
        with prometheus(targets, tmp_path / "prometheus") as prom:
            body = {"text_input": "Once upon a time", "parameters": {"max_tokens": 16}}
            async with (
                httpx.AsyncClient(base_url=url, timeout=60) as client,
                httpx.AsyncClient(base_url=generator.url, timeout=60) as text,
            ):
                for _ in range(3):  # a few bursts, so rates span more than one scrape
                    await asyncio.gather(
                        *(
                            client.post("/v1/models/adder:predict", json={"instances": [n]})
                            for n in range(24)
                        ),
                        *(text.post("/v2/models/gpt2/generate", json=body) for _ in range(6)),
                    )
            empty: list[Any] = []
            # The router's panels: their metrics and labels are checked against the router's own
            # registry (test_dashboard_router.py); no router runs here.
            for title, expr in (query for query in panel_queries() if "batchd_router_" not in query[1]):
                try:
                    await asyncio.to_thread(prom.wait_for, expr, has_data, 20)
                except TimeoutError:
                    empty.append((title, expr))
    assert empty == [], "panels whose queries return nothing"
