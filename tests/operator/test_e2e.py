"""End to end: the real Kopf operator against the emulated API server (`batchd.testing.apiserver`).

Every BatchedDeployment the tests create passes the CRD's admission (defaults, schema, CEL), and
every child the operator sends is validated against the Kubernetes schemas; a refusal is a 422,
so a test cannot pass on an object a real API server would reject.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from prometheus_client import REGISTRY

from batchd.operator import children
from batchd.testing.apiserver import ApiServer
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import (
    CR_PATH,
    api_server,
    create,
    eventually,
    patch,
    running_operator,
    settled,
)
from batchd.testing.servers import free_port

NS = "default"
BD = "serving.batchd.dev/batcheddeployments"
DEPLOYMENTS = "apps/deployments"


def cr(server: ApiServer, name: str) -> dict[str, Any]:
    return server.get_object(BD, NS, name) or {}


def condition(server: ApiServer, name: str, type_: str) -> dict[str, Any]:
    for item in cr(server, name).get("status", {}).get("conditions", []):
        if item["type"] == type_:
            return dict(item)
    return {}


async def degraded_condition(server: ApiServer, name: str) -> dict[str, Any]:
    """Wait (bounded) for the resource's Degraded condition to be True, and return it."""
    return await eventually(
        lambda: (
            condition(server, name, "Degraded").get("status") == "True"
            and condition(server, name, "Degraded")
        ),
        what=f"{name}: Degraded=True",
    )


def children_of(server: ApiServer, name: str) -> dict[str, dict[str, Any] | None]:
    return {
        "ConfigMap": server.get_object("configmaps", NS, children.config_map_name(name)),
        "Deployment": server.get_object(DEPLOYMENTS, NS, name),
        "Service": server.get_object("services", NS, name),
    }


def all_children(server: ApiServer, name: str) -> bool:
    return all(children_of(server, name).values())


async def report_ready(server: ApiServer, name: str, ready: int) -> None:
    """What the Deployment controller and kubelets would write: `ready` pods of the desired count."""
    deployment = server.get_object(DEPLOYMENTS, NS, name)
    assert deployment is not None
    desired = deployment["spec"]["replicas"]
    await patch(
        server,
        f"/apis/apps/v1/namespaces/{NS}/deployments/{name}/status",
        {
            "status": {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": desired,
                "updatedReplicas": desired,
                "readyReplicas": ready,
                "availableReplicas": ready,
            }
        },
    )


async def test_create_makes_children_owned_by_the_resource(tmp_path: Path) -> None:
    async with api_server(tmp_path) as server, running_operator(server):
        body = await create(server, manifest("adder", num_replicas=2))
        await eventually(lambda: all_children(server, "adder"), what="ConfigMap, Deployment and Service")
        for kind, child in children_of(server, "adder").items():
            assert child is not None
            (owner,) = child["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["uid"], owner["controller"]) == (
                "BatchedDeployment",
                body["metadata"]["uid"],
                True,
            ), kind
        deployment = server.get_object(DEPLOYMENTS, NS, "adder")
        assert deployment is not None and deployment["spec"]["replicas"] == 2
        status = await eventually(lambda: cr(server, "adder").get("status"), what="a status")
        assert status["url"] == "http://adder.default.svc.cluster.local:8000"
        assert status["selector"] == children.selector_string("adder")
        assert condition(server, "adder", "Ready")["reason"] == "NoReplicasReady"
        assert server.refused == []


async def test_scale_through_spec_and_scale_subresource_changes_only_replicas(tmp_path: Path) -> None:
    async with api_server(tmp_path) as server, running_operator(server):
        await create(server, manifest("adder"))
        await eventually(lambda: all_children(server, "adder"), what="the children")
        await eventually(lambda: cr(server, "adder").get("status"), what="a status")
        await settled(server)
        before = children_of(server, "adder")

        await patch(server, f"{CR_PATH.format(ns=NS)}/adder", {"spec": {"num_replicas": 3}})
        await eventually(
            lambda: (server.get_object(DEPLOYMENTS, NS, "adder") or {}).get("spec", {}).get("replicas") == 3,
            what="the Deployment to follow spec.num_replicas",
        )

        # kubectl scale / an HPA: the scale subresource of the BatchedDeployment.
        scale_path = f"{CR_PATH.format(ns=NS)}/adder/scale"
        await patch(server, scale_path, {"spec": {"replicas": 5}})
        assert cr(server, "adder")["spec"]["num_replicas"] == 5
        await eventually(
            lambda: (server.get_object(DEPLOYMENTS, NS, "adder") or {}).get("spec", {}).get("replicas") == 5,
            what="the Deployment to follow the scale subresource",
        )

        after = children_of(server, "adder")
        assert after["ConfigMap"] == before["ConfigMap"]  # same resourceVersion: untouched
        assert after["Service"] == before["Service"]
        assert before["Deployment"] is not None and after["Deployment"] is not None
        assert after["Deployment"]["spec"]["template"] == before["Deployment"]["spec"]["template"]
        scale = await (await server.get(scale_path)).json()
        assert scale["spec"]["replicas"] == 5
        assert scale["status"]["selector"] == children.selector_string("adder")
        assert server.refused == []


async def test_status_and_events_follow_the_deployment(tmp_path: Path) -> None:
    async with api_server(tmp_path) as server, running_operator(server):
        await create(server, manifest("adder", num_replicas=2))
        await eventually(
            lambda: condition(server, "adder", "Ready").get("reason") == "NoReplicasReady", what="Ready=False"
        )
        await report_ready(server, "adder", 1)
        await eventually(
            lambda: condition(server, "adder", "Ready").get("reason") == "ReplicasNotReady", what="1/2 ready"
        )
        await report_ready(server, "adder", 2)
        await eventually(
            lambda: condition(server, "adder", "Ready").get("status") == "True", what="Ready=True"
        )
        status = cr(server, "adder")["status"]
        assert (status["replicas"], status["ready_replicas"]) == (2, 2)
        assert condition(server, "adder", "Progressing")["reason"] == "RolloutComplete"
        assert status["observed_generation"] == cr(server, "adder")["metadata"]["generation"]
        reasons = await eventually(
            lambda: (
                {event.get("reason") for event in server.posted_events}
                >= {"NoReplicasReady", "AllReplicasReady"}
                and [event.get("reason") for event in server.posted_events]
            ),
            what="transition events",
        )
        assert reasons.count("AllReplicasReady") == 1  # one event per transition, not per reconcile


async def test_deleted_or_edited_children_are_restored(tmp_path: Path) -> None:
    async with api_server(tmp_path) as server, running_operator(server):
        await create(server, manifest("adder"))
        await eventually(lambda: all_children(server, "adder"), what="the children")
        await settled(server)
        original = children_of(server, "adder")
        assert original["Deployment"] is not None and original["ConfigMap"] is not None

        response = await server.delete(f"/apis/apps/v1/namespaces/{NS}/deployments/adder")
        assert response.status == 200
        restored = await eventually(
            lambda: server.get_object(DEPLOYMENTS, NS, "adder"), what="the Deployment to come back"
        )
        assert restored["metadata"]["uid"] != original["Deployment"]["metadata"]["uid"]
        assert restored["spec"]["template"] == original["Deployment"]["spec"]["template"]

        await patch(
            server,
            f"/apis/apps/v1/namespaces/{NS}/deployments/adder",
            {
                "spec": {
                    "replicas": 9,
                    "template": {"spec": {"containers": [{"name": "replica", "image": "evil:latest"}]}},
                }
            },
        )
        await eventually(
            lambda: (
                (server.get_object(DEPLOYMENTS, NS, "adder") or {}).get("spec", {})
                == original["Deployment"]["spec"]
            ),
            what="the edited Deployment to be put back",
        )

        name = children.config_map_name("adder")
        await patch(server, f"/api/v1/namespaces/{NS}/configmaps/{name}", {"data": {"manifest.yaml": "x"}})
        await eventually(
            lambda: (
                (server.get_object("configmaps", NS, name) or {}).get("data") == original["ConfigMap"]["data"]
            ),
            what="the edited ConfigMap to be put back",
        )
        assert server.refused == []


def template_hash(server: ApiServer, name: str) -> str:
    deployment = server.get_object(DEPLOYMENTS, NS, name) or {}
    return str(deployment["spec"]["template"]["metadata"]["annotations"][children.CONFIG_HASH_ANNOTATION])


async def test_a_model_edit_rolls_the_pods(tmp_path: Path) -> None:
    async with api_server(tmp_path) as server, running_operator(server):
        await create(server, manifest("adder"))
        await eventually(lambda: server.get_object(DEPLOYMENTS, NS, "adder"), what="the Deployment")
        old_hash = template_hash(server, "adder")
        await patch(server, f"{CR_PATH.format(ns=NS)}/adder", {"spec": {"model": {"init_kwargs": {"x": 1}}}})
        await eventually(lambda: template_hash(server, "adder") != old_hash, what="a new pod template")


async def test_a_batching_edit_reaches_the_replicas_manifest_without_rolling_the_pods(tmp_path: Path) -> None:
    async with api_server(tmp_path) as server, running_operator(server):
        await create(server, manifest("adder"))
        await eventually(lambda: cr(server, "adder").get("status", {}).get("batching"), what="a status")
        old_hash = template_hash(server, "adder")
        revision = cr(server, "adder")["status"]["batching"]["revision"]
        await patch(server, f"{CR_PATH.format(ns=NS)}/adder", {"spec": {"batching": {"max_batch_size": 8}}})

        def replicas_manifest() -> str:
            config = server.get_object("configmaps", NS, children.config_map_name("adder")) or {}
            return str(config.get("data", {}).get("manifest.yaml", ""))

        await eventually(lambda: "max_batch_size: 8" in replicas_manifest(), what="the new batching")
        new_revision = cr(server, "adder")["metadata"]["generation"]
        assert f"serving.batchd.dev/batching-revision: '{new_revision}'" in replicas_manifest()
        await eventually(
            lambda: cr(server, "adder")["status"]["batching"]["revision"] == new_revision > revision,
            what="the status to name the new batching revision",
        )
        assert template_hash(server, "adder") == old_hash  # the running pods stay


async def test_operator_restarted_midway_makes_no_duplicates(tmp_path: Path) -> None:
    async with api_server(tmp_path) as server:
        async with running_operator(server):
            for name in ("one", "two", "three"):
                await create(server, manifest(name))
            await eventually(lambda: server.get_object(DEPLOYMENTS, NS, "one"), what="the first Deployment")
        # Stopped in the middle; meanwhile a child goes away and a resource is added.
        response = await server.delete(f"/api/v1/namespaces/{NS}/services/one")
        assert response.status == 200
        await create(server, manifest("four"))
        async with running_operator(server):
            for name in ("one", "two", "three", "four"):
                await eventually(lambda name=name: all_children(server, name), what=f"children of {name}")
                await eventually(lambda name=name: cr(server, name).get("status"), what=f"status of {name}")
        assert len(server.list_objects(DEPLOYMENTS, NS)) == 4
        assert len(server.list_objects("services", NS)) == 4
        assert len(server.list_objects("configmaps", NS)) == 4
        creates = [call for call in server.calls if call == ("apps", "deployments", "create")]
        assert len(creates) == 4  # each Deployment created once, across both operator runs
        assert server.refused == []


async def test_bad_spec_is_degraded_while_others_reconcile(tmp_path: Path) -> None:
    async with api_server(tmp_path) as server, running_operator(server):
        # Accepted by the CRD (env items are Kubernetes' own type, kept as given) but not by the
        # API server's Deployment validation: the operator must say so on the resource.
        await create(server, manifest("noname-env", env=[{"value": "no name"}]))
        await create(server, manifest("fine"))
        degraded = await degraded_condition(server, "noname-env")
        assert degraded["reason"] == "DeploymentRefused"
        assert "env" in degraded["message"] and "name" in degraded["message"]
        await eventually(lambda: all_children(server, "fine"), what="the good resource's children")
        assert condition(server, "fine", "Degraded").get("status") != "True"
        await eventually(
            lambda: any(
                event.get("type") == "Warning" and event.get("reason") == "DeploymentRefused"
                for event in server.posted_events
            ),
            what="a Warning event",
        )


async def test_spec_stored_before_a_stricter_crd_is_degraded(tmp_path: Path) -> None:
    async with api_server(tmp_path) as server:
        # Written straight into storage, as an object admitted by an older, laxer CRD would be.
        bad = manifest("legacy", model={"task": "feature-extraction"})
        bad["metadata"].update(namespace=NS, uid="legacy-uid", resourceVersion="1", generation=1)
        server.objects[server.known_by_plural(BD).key, NS, "legacy"] = bad
        server.live_uids.add("legacy-uid")
        async with running_operator(server):
            await create(server, manifest("fine"))
            degraded = await degraded_condition(server, "legacy")
            assert degraded["reason"] == "InvalidSpec"
            assert "model.source is required" in degraded["message"]
            await eventually(lambda: all_children(server, "fine"), what="the good resource's children")
            assert server.get_object(DEPLOYMENTS, NS, "legacy") is None


async def test_delete_lets_go_cleanly(tmp_path: Path) -> None:
    async with api_server(tmp_path) as server, running_operator(server):
        await create(server, manifest("adder"))
        await eventually(lambda: all_children(server, "adder"), what="the children")
        await eventually(lambda: cr(server, "adder").get("status"), what="a status")
        assert not cr(server, "adder")["metadata"].get("finalizers")  # nothing will block a delete
        response = await server.delete(f"{CR_PATH.format(ns=NS)}/adder")
        assert response.status == 200
        assert server.get_object(BD, NS, "adder") is None
        await eventually(lambda: not any(children_of(server, "adder").values()), what="the children to go")
        calls_after = len(server.calls)
        # The operator does not bring anything back for a resource that is gone.
        await create(server, manifest("other"))
        await eventually(lambda: all_children(server, "other"), what="another resource's children")
        assert not any(children_of(server, "adder").values())
        assert len(server.calls) > calls_after


async def test_liveness_endpoint_and_reconcile_metrics(tmp_path: Path) -> None:
    liveness_port, metrics_port = free_port(), free_port()
    async with (
        api_server(tmp_path) as server,
        running_operator(
            server, liveness_endpoint=f"http://127.0.0.1:{liveness_port}/healthz", metrics_port=metrics_port
        ),
        httpx.AsyncClient() as client,
    ):

        def refused() -> float:
            return REGISTRY.get_sample_value("batchd_operator_reconciles_total", {"outcome": "refused"}) or 0

        before = refused()
        await create(server, manifest("noname-env", env=[{"value": "no name"}]))
        await eventually(
            lambda: condition(server, "noname-env", "Degraded").get("status") == "True", what="Degraded=True"
        )
        health = await client.get(f"http://127.0.0.1:{liveness_port}/healthz")
        assert health.status_code == 200 and health.json()["reconciler"] is True
        metrics = (await client.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
        assert 'batchd_operator_reconciles_total{outcome="success"}' in metrics
        assert "batchd_operator_reconcile_duration_seconds_bucket" in metrics
        # Counted once the reconcile returns, just after it wrote the status the test saw.
        await eventually(lambda: refused() > before, what="the refused reconcile to be counted")


async def test_desired_and_ready_replicas_are_exported_until_the_resource_goes(tmp_path: Path) -> None:
    labels = {"namespace": NS, "deployment": "gauged"}

    def gauges() -> tuple[float | None, float | None]:
        return (
            REGISTRY.get_sample_value("batchd_operator_desired_replicas", labels),
            REGISTRY.get_sample_value("batchd_operator_ready_replicas", labels),
        )

    async with api_server(tmp_path) as server, running_operator(server):
        await create(server, manifest("gauged", num_replicas=3))
        await eventually(lambda: all_children(server, "gauged"), what="the children")
        await report_ready(server, "gauged", 2)
        await eventually(lambda: gauges() == (3.0, 2.0), what="desired 3, ready 2 in the operator's metrics")
        response = await server.delete(f"{CR_PATH.format(ns=NS)}/gauged")
        assert response.status == 200
        await eventually(lambda: gauges() == (None, None), what="the deleted resource's series to go")
