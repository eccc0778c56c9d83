"""Rendering the chart with the real Helm library (helm-python-sdk), for the chart tests."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import yaml

from batchd.testing import ROOT

CHART = ROOT / "charts" / "batchd"
SCENARIOS = {"default": {}} | {
    path.stem: yaml.safe_load(path.read_text()) for path in sorted((CHART / "ci").glob("*-values.yaml"))
}


def render(values: dict[str, Any] | None = None, namespace: str = "batchd-system") -> list[dict[str, Any]]:
    """Every object the chart's templates produce for these values (install of release `batchd`)."""
    chart = helm.Chart.load(str(CHART))
    manifests = chart.render(values or {}, name="batchd", namespace=namespace, is_install=True)
    objects: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found
