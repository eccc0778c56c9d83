"""Every pod batchd makes is admitted by the real API server's PodSecurity admission at the
"restricted" level: the replicas the operator renders (for each example and a GPU spec) and the
operator and router pods the chart renders, for each of its test scenarios. Each pod is created with
a server-side dry run in a namespace labelled `pod-security.kubernetes.io/enforce: restricted`."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from batchd.api.manifest import load_manifest, parse_manifest
from batchd.operator import children
from batchd.operator.settings import Settings
from batchd.testing import ROOT
from batchd.testing.helm import SCENARIOS, render
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.manifests import manifest

pytestmark = pytest.mark.slow

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


def pod_of(template: dict[str, Any], name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": name},
        "spec": template["spec"],
    }


def admit(cluster: ControlPlane, namespace: str, pod: dict[str, Any]) -> str:
    """'' when the API server would create the pod, else its refusal."""
    result = cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod), check=False
    )
    return "" if result.returncode == 0 else result.stderr


@pytest.mark.parametrize("name", sorted(SPECS))
def test_replica_pods_are_admitted_as_restricted(
    control_plane: ControlPlane, kube_namespace: str, name: str
) -> None:
    template = children.deployment(SPECS[name], Settings())["spec"]["template"]
    assert admitted(control_plane, kube_namespace, pod_of(template, name)) == ""


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_operator_and_router_pods_are_admitted_as_restricted(
    control_plane: ControlPlane, kube_namespace: str, scenario: str
) -> None:
    deployments = [o for o in render(SCENARIOS[scenario]) if o["kind"] == "Deployment"]
    components = sorted(d["metadata"]["labels"]["app.kubernetes.io/component"] for d in deployments)
    assert components == ["operator", "router"]
    for deployment in deployments:
        pod = pod_of(deployment["spec"]["template"], deployment["metadata"]["name"])
        assert admitted(control_plane, kube_namespace, pod) == ""


def admitted(control_plane: ControlPlane, namespace: str, pod: dict[str, Any]) -> str:
    """`admit`, with the ServiceAccount the chart or the operator makes beside the pod (the API
    server admits no pod without its account)."""
    account = pod["spec"].get("serviceAccountName")
    if account:
        control_plane.kubectl("create", "serviceaccount", account, "-n", namespace, check=False)
    return admit(control_plane, namespace, pod)


def test_the_admission_refuses_what_the_standard_refuses(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    # The check above shown to fail: each broken rule is named in the refusal.
    pod = pod_of(children.deployment(SPECS["gpu-with-pvc"], Settings())["spec"]["template"], "broken")
    broken = copy.deepcopy(pod)
    spec = broken["spec"]
    spec["hostNetwork"] = True
    spec["volumes"] = [*spec.get("volumes", []), {"name": "h", "hostPath": {"path": "/"}}]
    spec["securityContext"] = {
        **spec["securityContext"],
        "runAsNonRoot": False,
        "seccompProfile": {"type": "Unconfined"},
    }
    container = spec["containers"][0]
    container["securityContext"] = {
        **container["securityContext"],
        "allowPrivilegeEscalation": True,
        "capabilities": {"add": ["SYS_ADMIN"]},
    }
    container["ports"] = [{"containerPort": 8000, "hostPort": 8000}]
    refusal = admitted(control_plane, kube_namespace, broken)
    assert 'violates PodSecurity "restricted:latest"' in refusal, refusal
    for rule in (
        "host namespaces",
        "restricted volume types",
        "seccompProfile",
        "allowPrivilegeEscalation",
        "unrestricted capabilities",
        "hostPort",
        "runAsNonRoot",
    ):
        assert rule in refusal, (rule, refusal)
