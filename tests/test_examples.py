"""The HPA and KEDA examples: valid, aimed at a BatchedDeployment that leaves scaling to them, and
asking for metrics the replicas really export."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from batchd.api.manifest import load_manifest
from batchd.replica.metrics import ReplicaMetrics
from batchd.testing import ROOT
from batchd.testing.schemas import KUBERNETES_VERSIONS

EXAMPLES = ROOT / "examples"


def example(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return document


def exported_metrics() -> set[str]:
    registry = ReplicaMetrics("d", "m").registry
    return {sample.name for family in registry.collect() for sample in family.samples} | {
        family.name for family in registry.collect()
    }


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_hpa_example_is_a_valid_hpa(version: str) -> None:
    kubernetes_validate.validate(example("hpa.yaml"), version, strict=True)


@pytest.mark.parametrize("name", ["hpa.yaml", "keda.yaml"])
def test_scalers_target_a_batched_deployment_without_its_own_autoscaling(name: str) -> None:
    target = example(name)["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == ("serving.batchd.dev/v1alpha1", "BatchedDeployment")
    bd = load_manifest(EXAMPLES / f"{target['name']}.yaml")
    assert bd.metadata.name == target["name"] and bd.spec.autoscaling is None


def test_scalers_read_metrics_the_replicas_export() -> None:
    exported = exported_metrics()
    hpa_metric = example("hpa.yaml")["spec"]["metrics"][0]["pods"]["metric"]["name"]
    query = example("keda.yaml")["spec"]["triggers"][0]["metadata"]["query"]
    named = {hpa_metric, *re.findall(r"(batchd_\w+)\{", query)}
    assert named and named <= exported, named - exported
