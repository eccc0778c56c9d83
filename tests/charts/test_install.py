"""batchd installed on a real Kubernetes API server as a user installs it: `helm install` of the
chart, then the operator and the router on the chart's own ServiceAccounts' tokens under RBAC,
and BatchedDeployments through `kubectl`.

The API server, controller manager and scheduler are the real ones (`batchd.testing.kubernetes`);
the server's audit log says what each ServiceAccount asked and what it was answered, so a permission
the chart does not grant fails these tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchd.api.crd import CRD_NAME
from batchd.testing import ROOT
from batchd.testing.kubernetes.components import forbidden
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.release import Release, installed
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """The chart, installed with its defaults into a `restricted` namespace, as a user would."""
    with installed(control_plane, tmp_path_factory.mktemp("install")) as release:
        yield release


def test_helm_install_is_accepted_by_the_api_server(release: Release) -> None:
    status = json.loads(
        release.cluster.helm("status", release.name, "-n", release.namespace, "-o", "json").stdout
    )
    assert status["info"]["status"] == "deployed"
    crd = release.get("crd", CRD_NAME)
    assert crd is not None
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True", crd["status"]


def test_the_chart_pods_are_admitted_by_pod_security_restricted(release: Release) -> None:
    # The ReplicaSet controller creates the pods; the PodSecurity admission refuses any that break
    # `restricted`, and the controller then records FailedCreate instead.
    def pods() -> list[str]:
        listed = json.loads(
            release.cluster.kubectl("get", "pods", "-n", release.namespace, "-o", "json").stdout
        )
        return sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in listed["items"])

    assert eventually(lambda: len(pods()) >= 3, what="the operator's and both routers' pods")
    assert pods().count("operator") == 1 and pods().count("router") == 2
    events = json.loads(
        release.cluster.kubectl(
            "get", "events", "-n", release.namespace, "--field-selector", "reason=FailedCreate", "-o", "json"
        ).stdout
    )
    assert events["items"] == []


INVALID: dict[str, tuple[dict[str, Any], str]] = {
    "a batch of no items": ({"batching": {"max_batch_size": 0}}, "spec.batching.max_batch_size"),
    "a replica count that is text": ({"num_replicas": "two"}, "spec.num_replicas"),
    "both task and handler": (
        {"model": {"task": "feature-extraction", "source": "hf://a/b", "handler": "m:f"}},
        "exactly one of model.task or model.handler must be set",
    ),
    "full batches that never fit the queue": (
        {"batching": {"allow_small_batch": False, "max_batch_size": 8, "max_queued_requests": 4}},
        "spec.batching.max_queued_requests",
    ),
    "Ray Serve's batching_config": ({"batching_config": {"max_batch_size": 4}}, "spec.batching_config"),
}


@pytest.mark.parametrize("case", INVALID)
def test_the_api_server_refuses_an_invalid_deployment_naming_the_field(release: Release, case: str) -> None:
    change, field = INVALID[case]
    document = yaml.safe_load((ROOT / "examples" / "adder.yaml").read_text())
    document["metadata"]["name"] = "invalid"
    for key, value in change.items():
        document["spec"][key] = (
            value if not isinstance(value, dict) else {**document["spec"].get(key, {}), **value}
        )
    if "task" in change.get("model", {}):
        document["spec"]["model"].pop("device", None)
    result = release.cluster.kubectl(
        "apply", "-n", release.namespace, "-f", "-", input=yaml.safe_dump(document), check=False
    )
    assert result.returncode != 0
    assert field in result.stderr, result.stderr
    assert release.get("bd", "invalid") is None


def test_the_operator_on_its_own_token_reconciles_scales_and_cleans_up(release: Release) -> None:
    cluster, ns = release.cluster, release.namespace
    seen = len(cluster.audit_events(release.operator_user))
    with release.operator(release.logs / "operator.log"):
        cluster.kubectl("apply", "-n", ns, "-f", str(ROOT / "examples" / "adder.yaml"))
        deployment = eventually(lambda: release.get("deployment", "adder"), what="the adder's Deployment")
        assert deployment["metadata"]["ownerReferences"][0]["kind"] == "BatchedDeployment"
        # The children are created one after another: the Service may follow the Deployment.
        eventually(lambda: release.get("service", "adder"), what="the adder's Service")
        # The scale subresource, as `kubectl scale` uses it.
        cluster.kubectl("scale", "-n", ns, "bd/adder", "--replicas=3")
        eventually(
            lambda: (release.get("deployment", "adder") or {}).get("spec", {}).get("replicas") == 3,
            what="the Deployment to follow kubectl scale",
        )

        # The printer columns, with the replicas the operator wrote to the status.
        def table() -> list[list[str]]:
            rows = [
                line.split() for line in cluster.kubectl("get", "bd", "adder", "-n", ns).stdout.splitlines()
            ]
            return rows if rows[1][2] == "3" else []

        header, row = eventually(table, what="kubectl get bd to show 3 desired replicas")
        assert header == [  # LOAD: -o wide
            "NAME",
            "MODEL",
            "DESIRED",
            "READY",
            "REVISION",
            "ROLLOUT",
            "CANARY",
            "MAX-BATCH",
            "STATUS",
            "AGE",
        ]
        assert row[:3] == ["adder", "examples.adder:BatchAdder.handle_batch", "3"]
        # Server-side apply of the manifest: the API server's field managers know that `kubectl scale`
        # owns num_replicas now, and the manifest's 1 wins only when forced.
        adder = str(ROOT / "examples" / "adder.yaml")
        conflict = cluster.kubectl("apply", "--server-side", "-n", ns, "-f", adder, check=False)
        assert conflict.returncode != 0 and ".spec.num_replicas" in conflict.stderr, conflict.stderr
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-n", ns, "-f", adder)
        eventually(
            lambda: (release.get("deployment", "adder") or {}).get("spec", {}).get("replicas") == 1,
            what="the Deployment to follow the applied manifest",
        )
        cluster.kubectl("delete", "-n", ns, "bd/adder")
        # The real garbage collector removes what the deployment owned (at once when it has seen the
        # CRD; within its 30 s rediscovery and a backoff when the CRD is seconds old).
        eventually(
            lambda: release.get("deployment", "adder") is None and release.get("service", "adder") is None,
            what="the children to be collected",
            timeout_s=90,
        )
    refused = forbidden(cluster, release.operator_user, since=seen)
    assert refused == [], refused


def test_the_router_on_its_own_token_watches_without_a_refusal(release: Release) -> None:
    cluster = release.cluster
    with release.router(release.logs / "router.log", 0):
        pass
    assert forbidden(cluster, release.router_user) == []


def test_a_permission_the_chart_does_not_grant_is_seen_refused(release: Release, tmp_path: Path) -> None:
    # The check the tests above rely on, shown to fail: without the CRD rule, Kopf's start is refused.
    cluster = release.cluster
    role = json.loads(cluster.kubectl("get", "clusterrole", release.name, "-o", "json").stdout)
    narrowed = [rule for rule in role["rules"] if "customresourcedefinitions" not in rule["resources"]]
    assert len(narrowed) < len(role["rules"])
    seen = len(cluster.audit_events(release.operator_user))

    def set_rules(rules: list[dict[str, Any]]) -> None:
        patch = [{"op": "replace", "path": "/rules", "value": rules}]
        cluster.kubectl("patch", "clusterrole", release.name, "--type=json", "-p", json.dumps(patch))

    # The operator's log says so too, where the check after every test looks (and fails a test
    # that was not provoking it): read here, it is this test's to expect. The API server records
    # the refusal as it answers, before the operator has logged it: the log is waited for too.
    logged: list[str] = []

    def logged_refusal() -> bool:
        logged.extend(release.component_logs.new_problems())
        return any("customresourcedefinitions" in line and "is forbidden" in line for line in logged)

    set_rules(narrowed)
    try:
        with release.operator(tmp_path / "operator.log"):
            refused = eventually(
                lambda: forbidden(cluster, release.operator_user, since=seen), what="a refused call"
            )
            eventually(logged_refusal, what="the operator's log of the refusal")
    finally:
        set_rules(role["rules"])
    logged.extend(release.component_logs.new_problems())  # and what it logged as it stopped
    assert any("customresourcedefinitions" in call for call in refused), refused


def test_the_cluster_reports_the_version_it_was_built_at(control_plane: ControlPlane) -> None:
    # What `kubectl version` shows a user, from the binaries `make kubernetes` built (ldflags).
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    built = control_plane.tools.kubernetes_version
    assert version["clientVersion"]["gitVersion"] == built
    assert version["serverVersion"]["gitVersion"] == built
    assert version["serverVersion"]["minor"] == built.split(".")[1]
