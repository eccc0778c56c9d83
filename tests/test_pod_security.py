"""Every pod batchd makes meets the Kubernetes "restricted" Pod Security Standard: the replicas
the operator renders (for each example and a GPU spec) and the operator the chart renders."""

from __future__ import annotations

import pytest

from batchd.api.manifest import load_manifest, parse_manifest
from batchd.operator import children
from batchd.operator.settings import Settings
from batchd.testing import ROOT
from batchd.testing.helm import SCENARIOS, render
from batchd.testing.manifests import manifest
from batchd.testing.pod_security import restricted_violations

SPECS = {
    path.stem: load_manifest(path)
    for path in sorted((ROOT / "examples").glob("*.yaml"))
    if path.stem not in ("hpa", "keda")
} | {
    "gpu-with-pvc": parse_manifest(
        manifest(
            "gpu",
            {"task": "feature-extraction", "source": "pvc://weights/minilm"},
            resources={"limits": {"nvidia.com/gpu": 1}},
            autoscaling={"max_replicas": 3},
        )
    )
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_replica_pods_are_restricted(name: str) -> None:
    template = children.deployment(SPECS[name], Settings())["spec"]["template"]
    assert restricted_violations(template["spec"], template["metadata"]) == []


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_operator_and_router_pods_are_restricted(scenario: str) -> None:
    deployments = [o for o in render(SCENARIOS[scenario]) if o["kind"] == "Deployment"]
    components = sorted(d["metadata"]["labels"]["app.kubernetes.io/component"] for d in deployments)
    assert components == ["operator", "router"]
    for deployment in deployments:
        template = deployment["spec"]["template"]
        assert restricted_violations(template["spec"], template["metadata"]) == []


def test_the_checker_refuses_what_the_standard_refuses() -> None:
    # A test that cannot fail proves nothing: the checker must name each broken rule.
    template = children.deployment(SPECS["gpu-with-pvc"], Settings())["spec"]["template"]
    pod = {**template["spec"], "hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}
    container = pod["containers"][0]
    pod["containers"] = [
        {
            **container,
            "securityContext": {
                **container["securityContext"],
                "allowPrivilegeEscalation": True,
                "capabilities": {"add": ["SYS_ADMIN"]},
            },
            "ports": [{"containerPort": 8000, "hostPort": 8000}],
        }
    ]
    pod["securityContext"] = {
        **pod["securityContext"],
        "runAsNonRoot": False,
        "seccompProfile": {"type": "Unconfined"},
    }
    problems = restricted_violations(pod)
    for field in (
        "spec.hostNetwork",
        "spec.volumes[0]",
        "spec.securityContext.seccompProfile.type",
        "spec.containers[0].securityContext.allowPrivilegeEscalation",
        "spec.containers[0].securityContext.capabilities.drop",
        "spec.containers[0].securityContext.capabilities.add",
        "spec.containers[0].ports[0].hostPort",
    ):
        assert any(problem.startswith(field) for problem in problems), (field, problems)
