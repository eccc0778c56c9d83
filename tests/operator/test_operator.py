"""End to end: the operator on a real cluster, as the chart runs it (its environment and its
ServiceAccount's token, under RBAC), driven with `kubectl` as a user would.

The API server validates every BatchedDeployment (schema, defaults, CEL) and every child the operator
sends; the controller manager's Deployment controller and garbage collector, the scheduler and the
node's kubelet do the rest. A test that needs replicas to be ready runs real replica pods.
"""

from __future__ import annotations

import json

import httpx
import pytest
import yaml

from batchd.api.crd import CRD_NAME
from batchd.api.manifest import parse_manifest
from batchd.api.pod import REVISION_LABEL, config_map_name, selector_string
from batchd.api.revisions import batching_revision_of
from batchd.operator import children
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.operated import Namespace, Operator
from batchd.testing.manifests import manifest
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow


def test_create_makes_children_owned_by_the_resource(operator: Operator, ns: Namespace) -> None:
    start = operator.requests()
    ns.apply(manifest("adder", num_replicas=2))
    eventually(lambda: ns.has_children("adder"), what="ConfigMap, Deployment and Service")
    uid = ns.bd("adder")["metadata"]["uid"]
    for kind, child in ns.children("adder").items():
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("BatchedDeployment", uid, True), kind
    assert ns.replicas("adder") == 2
    status = eventually(
        lambda: ns.bd("adder").get("status", {}).get("url") and ns.bd("adder")["status"], what="a status"
    )
    assert status["url"] == f"http://{operator.release.name}-router.{operator.release.namespace}.svc"
    assert status["selector"] == selector_string("adder")
    assert operator.refused(start, ns.name) == []


def test_scale_through_spec_and_scale_subresource_changes_only_replicas(
    operator: Operator, ns: Namespace
) -> None:
    start = operator.requests()
    ns.apply(manifest("adder"))
    eventually(lambda: ns.has_children("adder"), what="the children")
    before = ns.children("adder")
    ns.patch("bd/adder", {"spec": {"num_replicas": 3}})
    eventually(lambda: ns.replicas("adder") == 3, what="the Deployment to follow spec.num_replicas")
    ns.kubectl("scale", "bd/adder", "--replicas=5")
    assert ns.bd("adder")["spec"]["num_replicas"] == 5
    eventually(lambda: ns.replicas("adder") == 5, what="the Deployment to follow the scale subresource")
    after = ns.children("adder")
    for kind in ("ConfigMap", "Service"):  # the same resourceVersion: untouched
        assert after[kind]["metadata"]["resourceVersion"] == before[kind]["metadata"]["resourceVersion"], kind
    assert after["Deployment"]["spec"]["template"] == before["Deployment"]["spec"]["template"]
    scale = json.loads(
        ns.kubectl(
            "get",
            "--raw",
            f"/apis/serving.batchd.dev/v1alpha1/namespaces/{ns.name}/batcheddeployments/adder/scale",
        )
    )
    assert scale["spec"]["replicas"] == 5
    assert scale["status"]["selector"] == selector_string("adder")
    assert operator.refused(start, ns.name) == []


def test_status_and_events_follow_real_replicas(operator: Operator, kube_node: Node, ns: Namespace) -> None:
    ns.apply(manifest("adder", num_replicas=2))
    eventually(
        lambda: ns.condition("adder", "Ready").get("reason") in ("NoReplicasReady", "ReplicasNotReady"),
        what="Ready=False while the replicas start",
    )
    ns.kubectl("wait", "--for=condition=Ready", "bd/adder", "--timeout=180s")
    status = ns.bd("adder")["status"]
    assert (status["replicas"], status["ready_replicas"]) == (2, 2)
    assert ns.condition("adder", "Progressing")["reason"] == "RolloutComplete"
    assert status["observed_generation"] == ns.bd("adder")["metadata"]["generation"]
    eventually(lambda: ns.events("AllReplicasReady"), what="the transition event")
    events = ns.events("AllReplicasReady")
    assert len(events) == 1, [e["message"] for e in events]  # one event per transition, not per reconcile
    # Scaled down, the Deployment's real rollout is followed to its end again.
    ns.kubectl("scale", "bd/adder", "--replicas=1")
    eventually(lambda: ns.bd("adder")["status"].get("replicas") == 1, what="the status to follow the scale")
    assert ns.condition("adder", "Ready")["status"] == "True"


def test_deleted_or_edited_children_are_restored(operator: Operator, ns: Namespace) -> None:
    start = operator.requests()
    ns.apply(manifest("adder"))
    eventually(lambda: ns.has_children("adder"), what="the children")
    original = ns.children("adder")
    ns.kubectl("delete", "deployment/adder", "--wait=false")
    restored = eventually(
        lambda: (
            (d := ns.get("deployment", "adder"))
            and d["metadata"]["uid"] != original["Deployment"]["metadata"]["uid"]
            and d
        ),
        what="the Deployment to come back",
    )
    assert restored["spec"]["template"] == original["Deployment"]["spec"]["template"]
    ns.patch(
        "deployment/adder",
        {
            "spec": {
                "replicas": 9,
                "template": {"spec": {"containers": [{"name": "replica", "image": "evil:latest"}]}},
            }
        },
    )
    eventually(
        lambda: (
            ns.get("deployment", "adder")["spec"]["template"] == original["Deployment"]["spec"]["template"]
            and ns.replicas("adder") == 1
        ),
        what="the edited Deployment to be put back",
    )
    name = config_map_name("adder")
    ns.patch(f"configmap/{name}", {"data": {"manifest.yaml": "x"}})
    eventually(
        lambda: ns.get("configmap", name).get("data") == original["ConfigMap"]["data"],
        what="the edited ConfigMap to be put back",
    )
    assert operator.refused(start, ns.name) == []


def template_hash(ns: Namespace, name: str) -> str:
    return str(
        ns.get("deployment", name)["spec"]["template"]["metadata"]["annotations"][
            children.CONFIG_HASH_ANNOTATION
        ]
    )


def test_a_model_edit_rolls_the_pods(operator: Operator, ns: Namespace) -> None:
    ns.apply(manifest("adder"))
    eventually(lambda: ns.get("deployment", "adder"), what="the Deployment")
    old_hash = template_hash(ns, "adder")
    old_revision = eventually(lambda: ns.bd("adder").get("status", {}).get("revision"), what="a revision")
    ns.patch("bd/adder", {"spec": {"model": {"init_kwargs": {"x": 1}}}})
    eventually(lambda: template_hash(ns, "adder") != old_hash, what="a new pod template")
    revision = eventually(
        lambda: (
            (ns.bd("adder")["status"].get("revision") or old_revision) != old_revision
            and ns.bd("adder")["status"]["revision"]
        ),
        what="the new revision in the status",
    )
    labels = ns.get("deployment", "adder")["spec"]["template"]["metadata"]["labels"]
    assert labels[REVISION_LABEL] == revision


def test_a_batching_edit_reaches_the_replicas_manifest_without_rolling_the_pods(
    operator: Operator, ns: Namespace
) -> None:
    ns.apply(manifest("adder"))
    eventually(lambda: ns.bd("adder").get("status", {}).get("batching"), what="a status")
    old_hash = template_hash(ns, "adder")
    revision = ns.bd("adder")["status"]["batching"]["revision"]
    ns.patch("bd/adder", {"spec": {"batching": {"max_batch_size": 8}}})

    def replicas_manifest() -> str:
        return str(ns.get("configmap", config_map_name("adder")).get("data", {}).get("manifest.yaml", ""))

    eventually(lambda: "max_batch_size: 8" in replicas_manifest(), what="the new batching")
    new_revision = batching_revision_of(parse_manifest(ns.bd("adder")).spec.batching)
    assert f"serving.batchd.dev/batching-revision: '{new_revision}'" in replicas_manifest()
    eventually(
        lambda: ns.bd("adder")["status"]["batching"]["revision"] == new_revision != revision,
        what="the status to name the new batching revision",
    )
    # Back to the first batching: the first revision again (a hash of the batching, not a count).
    ns.patch("bd/adder", {"spec": {"batching": {"max_batch_size": 32}}})
    eventually(
        lambda: ns.bd("adder")["status"]["batching"]["revision"] == revision,
        what="the status to name the first batching revision again",
    )
    assert template_hash(ns, "adder") == old_hash  # the running pods stay


def test_bad_spec_is_degraded_while_others_reconcile(operator: Operator, ns: Namespace) -> None:
    # Accepted by the CRD (env items are Kubernetes' own type, kept as given) but refused by the API
    # server's Deployment validation: the operator must say so on the resource.
    ns.apply(manifest("bad-env", env=[{"name": "NOT=A NAME", "value": "x"}]))
    ns.apply(manifest("fine"))
    degraded = eventually(
        lambda: (
            ns.condition("bad-env", "Degraded").get("status") == "True"
            and ns.condition("bad-env", "Degraded")
        ),
        what="bad-env: Degraded=True",
    )
    assert degraded["reason"] == "DeploymentRefused"
    assert "env" in degraded["message"] and "NOT=A NAME" in degraded["message"]
    eventually(lambda: ns.has_children("fine"), what="the good resource's children")
    assert ns.condition("fine", "Degraded").get("status") != "True"
    eventually(
        lambda: any(event["type"] == "Warning" for event in ns.events("DeploymentRefused")),
        what="a Warning event",
    )


def test_spec_stored_before_a_stricter_crd_is_degraded(operator: Operator, ns: Namespace) -> None:
    # An object admitted by an older, laxer CRD: the rule is taken out, the object created, the
    # rule put back (the API server keeps what it stored).
    crd = json.loads(ns.kubectl("get", "crd", CRD_NAME, "-o", "json"))
    path = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/model/x-kubernetes-validations"
    rules = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "model"
    ]["x-kubernetes-validations"]
    lax = [rule for rule in rules if "has(self.source)" not in rule["rule"]]
    assert len(lax) == len(rules) - 1
    replace = [{"op": "replace", "path": path, "value": lax}]
    ns.cluster.kubectl("patch", "crd", CRD_NAME, "--type=json", "-p", json.dumps(replace))
    try:
        eventually(
            lambda: (
                ns.cluster.kubectl(
                    "-n",
                    ns.name,
                    "apply",
                    "-f",
                    "-",
                    check=False,
                    input=yaml.safe_dump(manifest("legacy", model={"task": "feature-extraction"})),
                ).returncode
                == 0
            ),
            what="the laxer CRD to admit the object",
        )
    finally:
        replace[0]["value"] = rules
        ns.cluster.kubectl("patch", "crd", CRD_NAME, "--type=json", "-p", json.dumps(replace))
    ns.apply(manifest("fine"))
    degraded = eventually(
        lambda: (
            ns.condition("legacy", "Degraded").get("status") == "True" and ns.condition("legacy", "Degraded")
        ),
        what="legacy: Degraded=True",
    )
    assert degraded["reason"] == "InvalidSpec"
    assert "model.source is required" in degraded["message"]
    eventually(lambda: ns.has_children("fine"), what="the good resource's children")
    assert ns.get("deployment", "legacy") == {}


def test_delete_lets_go_cleanly(operator: Operator, ns: Namespace) -> None:
    ns.apply(manifest("adder"))
    eventually(lambda: ns.has_children("adder"), what="the children")
    assert not ns.bd("adder")["metadata"].get("finalizers")  # nothing will block a delete
    ns.kubectl("delete", "bd/adder", "--timeout=30s")
    eventually(lambda: not any(ns.children("adder").values()), what="the children to go", timeout_s=90)
    # The operator brings nothing back for a resource that is gone.
    ns.apply(manifest("other"))
    eventually(lambda: ns.has_children("other"), what="another resource's children")
    assert not any(ns.children("adder").values())


def test_liveness_endpoint_and_reconcile_metrics(operator: Operator, ns: Namespace) -> None:
    def refusals() -> float:
        for line in httpx.get(operator.metrics_url).text.splitlines():
            if line.startswith('batchd_operator_reconciles_total{outcome="refused"}'):
                return float(line.split()[-1])
        return 0.0

    before = refusals()
    ns.apply(manifest("bad-env", env=[{"name": "NOT=A NAME", "value": "x"}]))
    eventually(lambda: ns.condition("bad-env", "Degraded").get("status") == "True", what="Degraded=True")
    health = httpx.get(operator.liveness_url)
    assert health.status_code == 200 and health.json()["reconciler"] is True
    metrics = httpx.get(operator.metrics_url).text
    assert 'batchd_operator_reconciles_total{outcome="success"}' in metrics
    assert "batchd_operator_reconcile_duration_seconds_bucket" in metrics
    eventually(lambda: refusals() > before, what="the refused reconcile to be counted")


def test_desired_and_ready_replicas_are_exported_until_the_resource_goes(
    operator: Operator, kube_node: Node, ns: Namespace
) -> None:
    def gauges() -> tuple[str | None, str | None]:
        found: dict[str, str] = {}
        for line in httpx.get(operator.metrics_url).text.splitlines():
            for gauge in ("desired", "ready"):
                if line.startswith(
                    f'batchd_operator_{gauge}_replicas{{deployment="gauged",namespace="{ns.name}"}}'
                ):
                    found[gauge] = line.split()[-1]
        return found.get("desired"), found.get("ready")

    ns.apply(manifest("gauged", num_replicas=2))
    eventually(
        lambda: gauges() == ("2.0", "2.0"), what="desired 2, ready 2 in the operator's metrics", timeout_s=180
    )
    ns.kubectl("delete", "bd/gauged")
    eventually(lambda: gauges() == (None, None), what="the deleted resource's series to go")
