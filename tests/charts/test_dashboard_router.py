"""The dashboard's router panels name only metrics the router exports, with the labels they use.

The router's registry is exercised on every series (each label set touched once) and read as
Prometheus reads it; a panel that names a metric or a label it lacks would show nothing.
"""

from __future__ import annotations

import json
import re

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batchd.router.metrics import RouterMetrics
from batchd.testing.helm import CHART

DASHBOARD = json.loads((CHART / "dashboards" / "batchd.json").read_text())
ROUTER_METRIC = re.compile(r"\bbatchd_router_\w+")
# PromQL's aggregation labels: `by (a, b)`.
GROUPING = re.compile(r"\bby \(([^)]*)\)")


def exported() -> dict[str, set[str]]:
    """Every sample name the router's registry exposes, with the labels it carries."""
    metrics = RouterMetrics()
    deployment = ("default", "adder")
    metrics.requests.labels(*deployment, "2xx").inc()
    metrics.decisions.labels(*deployment, "two_choices").inc()
    metrics.prefix_routes.labels(*deployment, "hit").inc()
    metrics.retries.labels(*deployment, "refused").inc()
    metrics.revisions.labels(*deployment, "canary").inc()
    metrics.held.labels(*deployment).set(1)
    metrics.hold_seconds.labels(*deployment).observe(0.5)
    metrics.holds.labels(*deployment, "released").inc()
    metrics.cold_starts.labels(*deployment).inc()
    metrics.replica_load.labels(*deployment, "10.0.0.1:8000").set(3)
    metrics.replicas.labels(*deployment).set(1)
    metrics.refusals.labels(*deployment, "team-a", "429", "requests_per_s").inc()
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def router_panels() -> list[dict[str, object]]:
    return [
        panel
        for panel in DASHBOARD["panels"]
        if any(ROUTER_METRIC.search(target["expr"]) for target in panel["targets"])
    ]


def test_the_router_has_panels_for_what_users_ask_of_it() -> None:
    titles = " ".join(str(panel["title"]).lower() for panel in router_panels())
    for wanted in (
        "requests held",
        "time held",
        "routing decisions",
        "retries",
        "load the router sees",
        "cold starts",
        "requests by revision",
        "refused callers",
    ):
        assert wanted in titles


def test_every_router_panel_names_exported_metrics_and_labels() -> None:
    samples = exported()
    for panel in DASHBOARD["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name in ROUTER_METRIC.findall(expr):
                assert name in samples, f"{panel['title']}: {name} is not exported by the router"
                for group in GROUPING.findall(expr):
                    labels = {label.strip() for label in group.split(",")} - {"le"}
                    assert labels <= samples[name], (
                        f"{panel['title']}: {name} has no label {labels - samples[name]}"
                    )
