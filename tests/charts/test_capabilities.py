"""What the chart renders depends on the cluster it meets: the Prometheus Operator's API and the
Kubernetes version, given to the real Helm renderer as `helm install` gets them from discovery.

helm-python-sdk's `Chart.render` does not expose these options yet; its native renderer accepts
them (`api_versions`, `kube_version`), so they are passed to it directly.
"""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import pytest
import yaml
from helm_python import _native

from batchd.testing.helm import CHART
from batchd.testing.schemas import KUBERNETES_VERSIONS

MONITORING_API = "monitoring.coreos.com/v1"


def render_on(
    values: dict[str, Any] | None = None, *, api_versions: list[str] | None = None, kube_version: str = ""
) -> list[dict[str, Any]]:
    options: dict[str, Any] = {"name": "batchd", "namespace": "batchd-system", "is_install": True}
    if api_versions:
        options["api_versions"] = api_versions
    if kube_version:
        options["kube_version"] = kube_version
    chart = helm.Chart.load(str(CHART))
    rendered = json.loads(
        _native.call_string("helm_render", chart._raw(), json.dumps(values or {}), json.dumps(options))
    )
    return [
        document
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt")
        for document in yaml.safe_load_all(text)
        if document
    ]


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def pod_annotations(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The pod annotations of the operator and the router, which agree on scraping."""
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    assert len(deployments) == 2
    annotations = [d["spec"]["template"]["metadata"].get("annotations") or {} for d in deployments]
    assert annotations[0].get("prometheus.io/scrape") == annotations[1].get("prometheus.io/scrape")
    return dict(annotations[0])


def test_the_renderer_really_receives_the_api_versions() -> None:
    # Without this, the tests below could pass on a renderer that ignores the option.
    assert "ServiceMonitor" not in kinds(render_on())
    assert "ServiceMonitor" in kinds(render_on(api_versions=[MONITORING_API]))


def test_monitors_appear_by_themselves_where_the_prometheus_operator_runs() -> None:
    objects = render_on(api_versions=[MONITORING_API])
    assert {"ServiceMonitor", "PodMonitor"} <= set(kinds(objects))
    assert not any(key.startswith("prometheus.io/") for key in pod_annotations(objects))


def test_monitors_can_be_turned_off_even_where_the_api_exists() -> None:
    objects = render_on({"monitoring": {"enabled": False}}, api_versions=[MONITORING_API])
    assert not {"ServiceMonitor", "PodMonitor"} & set(kinds(objects))
    assert pod_annotations(objects)["prometheus.io/scrape"] == "true"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_supported_kubernetes_version_renders_the_same_objects(version: str) -> None:
    assert kinds(render_on(kube_version=f"v{version}.0")) == kinds(render_on())


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_chart_lints_clean_for_every_supported_kubernetes_version(version: str) -> None:
    # Lint checks the rendered API versions against what this Kubernetes version still serves.
    report = helm.lint(
        str(CHART), {"monitoring": {"enabled": True}}, strict=True, kube_version=f"v{version}.0"
    )
    assert report["errors"] == [] and report["messages"] == [], report
