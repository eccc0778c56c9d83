"""The stand-in cluster runs what the real operator asks for: real replica processes behind pods.

Each test runs the real Kopf operator against the emulated API server and `Cluster` (the
Deployment controller, kubelet and endpoints stand-in), and drives it the way a user or an
autoscaler would: through the API. The first test checks the emulator's graceful pod deletion on
its own, without processes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from batchd.api.pod import CONFIG_PATH
from batchd.testing.apiserver import ApiServer
from batchd.testing.cluster import (
    DELETION_COST_ANNOTATION,
    NODE_NAME,
    TEMPLATE_HASH_LABEL,
    Cluster,
    PodView,
    template_hash,
)
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import CR_PATH, api_server, create, eventually, patch, running_operator

NS = "default"
HANDLER = "batchd.testing.batch_handlers:add_one"
PODS = f"/api/v1/namespaces/{NS}/pods"
START_S = 60.0  # replica processes start in about a second; the machine may be busy


@contextlib.asynccontextmanager
async def stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, drain_delay_s: int = 0
) -> AsyncIterator[tuple[ApiServer, Cluster]]:
    """API server, operator (with this preStop sleep) and the stand-in cluster, stopped in reverse."""
    monkeypatch.setenv("BATCHD_DRAIN_DELAY_S", str(drain_delay_s))  # read by the operator's Settings
    async with (
        api_server(tmp_path) as server,
        running_operator(server),
        Cluster(server, tmp_path / "cluster", config_sync_period_s=0.2) as cluster,
    ):
        yield server, cluster


def cr(server: ApiServer, name: str) -> dict[str, Any]:
    return server.get_object("serving.batchd.dev/batcheddeployments", NS, name) or {}


async def ready_pods(cluster: Cluster, name: str, count: int) -> list[PodView]:
    """Wait until exactly `count` pods exist and all are ready; oldest first."""

    def probe() -> list[PodView]:
        pods = cluster.pods(name)
        return pods if len(pods) == count and all(pod.ready for pod in pods) else []

    return await eventually(probe, timeout_s=START_S, what=f"{count} ready pods of {name}")


def environment_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/environ").read_text().split("\0")


async def predict(client: httpx.AsyncClient, url: str, name: str, number: int) -> Any:
    response = await client.post(f"{url}/v1/models/{name}:predict", json={"instances": [number]})
    assert response.status_code == 200, response.text
    return response.json()


async def test_the_api_server_deletes_a_running_pod_only_when_its_kubelet_confirms(tmp_path: Path) -> None:
    async with api_server(tmp_path) as server:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {
                "nodeName": NODE_NAME,
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "c", "image": "i"}],
            },
        }
        created = await (await server.post(PODS, json={**pod, "status": {"phase": "Running"}})).json()
        assert created["status"] == {"phase": "Pending"}  # the API server's, whatever was sent
        deleted = await (await server.delete(f"{PODS}/p")).json()
        assert deleted["metadata"]["deletionGracePeriodSeconds"] == 30
        assert deleted["metadata"]["deletionTimestamp"] > deleted["metadata"]["creationTimestamp"]
        await patch(server, f"{PODS}/p/status", {"status": {"phase": "Running"}})
        assert server.get_object("pods", NS, "p") is not None  # still there, terminating
        await server.delete(f"{PODS}/p", params={"gracePeriodSeconds": "0"})
        assert server.get_object("pods", NS, "p") is None

        unscheduled = {
            **pod,
            "metadata": {"name": "q"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }
        await server.post(PODS, json=unscheduled)
        await server.delete(f"{PODS}/q")
        assert server.get_object("pods", NS, "q") is None  # no kubelet to wait for


@pytest.mark.slow  # real replica processes
async def test_replicas_run_on_their_own_addresses_and_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with stack(tmp_path, monkeypatch) as (server, cluster):
        await create(server, manifest("adder", HANDLER, num_replicas=2))
        pods = await ready_pods(cluster, "adder", 2)

        ips = {pod.ip for pod in pods}
        assert len(ips) == 2 and all(ip and ip.startswith("127.") and ip != "127.0.0.1" for ip in ips)
        assert len({pod.pid for pod in pods}) == 2 and None not in {pod.pid for pod in pods}
        deployment = server.get_object("apps/deployments", NS, "adder")
        assert deployment is not None
        current = template_hash(deployment["spec"]["template"])
        for view in pods:
            pod = server.get_object("pods", NS, view.name)
            assert pod is not None
            assert view.name.startswith(f"adder-{current}-")
            assert pod["metadata"]["labels"] == {
                **deployment["spec"]["template"]["metadata"]["labels"],
                TEMPLATE_HASH_LABEL: current,
            }
            assert pod["metadata"]["annotations"] == deployment["spec"]["template"]["metadata"]["annotations"]
            (owner,) = pod["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["uid"]) == ("Deployment", deployment["metadata"]["uid"])
            assert pod["status"]["podIP"] == view.ip and pod["status"]["phase"] == "Running"
            # The ConfigMap reached the process where the operator mounted it.
            config = yaml.safe_load(cluster.host_path(view.name, CONFIG_PATH).read_text())
            assert config["metadata"]["name"] == "adder"

        status = await eventually(
            lambda: (
                (cr(server, "adder").get("status") or {}).get("ready_replicas") == 2
                and cr(server, "adder")["status"]
            ),
            what="the BatchedDeployment to report 2 ready replicas",
        )
        assert status["replicas"] == 2
        deployment = server.get_object("apps/deployments", NS, "adder")
        assert deployment is not None
        assert {
            key: deployment["status"].get(key) for key in ("replicas", "readyReplicas", "updatedReplicas")
        } == {
            "replicas": 2,
            "readyReplicas": 2,
            "updatedReplicas": 2,
        }
        assert deployment["status"]["observedGeneration"] == deployment["metadata"]["generation"]

        endpoints = cluster.endpoints("adder")
        assert sorted(endpoints) == sorted(pod.url for pod in pods)
        async with httpx.AsyncClient(timeout=10) as client:
            for url in endpoints:
                assert await predict(client, url, "adder", 1) == {"predictions": [2]}
        # The kubelet's and controllers' writes are theirs, not the operator's (the chart's RBAC test).
        assert not {call for call in server.calls if call[2] in ("create", "delete") and call[1] == "pods"}


@pytest.mark.slow  # real replica processes
async def test_scale_down_removes_the_cheapest_pod_which_drains_and_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with stack(tmp_path, monkeypatch, drain_delay_s=1) as (server, cluster):
        await create(server, manifest("adder", HANDLER, num_replicas=2))
        older, newer = await ready_pods(cluster, "adder", 2)
        # Without a cost the newer pod would go first; a higher cost keeps it.
        await patch(
            server, f"{PODS}/{newer.name}", {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "100"}}}
        )
        await eventually(lambda: (cluster.pod(newer.name) or newer).deletion_cost == 100, what="the cost")

        await patch(server, f"{CR_PATH.format(ns=NS)}/adder", {"spec": {"num_replicas": 1}})
        # Terminating: the kubelet reports it unready (out of the endpoints) first, while its
        # process still runs the preStop sleep; the deletion and that report are two API writes.
        going = await eventually(
            lambda: (
                (view := cluster.pod(older.name)) is not None and view.terminating and not view.ready and view
            ),
            what=f"{older.name} to be deleted and reported unready",
        )
        assert going.pid == older.pid
        assert cluster.endpoints("adder") == [newer.url]
        await eventually(lambda: cluster.pod(older.name) is None, timeout_s=30, what=f"{older.name} gone")
        assert cluster.exit_codes(older.name) == [0], cluster.log(older.name)  # drained; SIGKILL is 137
        (kept,) = cluster.pods("adder")
        assert (kept.name, kept.pid, kept.ready) == (newer.name, newer.pid, True)
        await eventually(
            lambda: (cr(server, "adder").get("status") or {}).get("replicas") == 1,
            what="the BatchedDeployment to report 1 replica",
        )


@pytest.mark.slow  # real replica processes
async def test_config_map_changes_are_projected_atomically_into_running_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with stack(tmp_path, monkeypatch) as (server, cluster):
        config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extra"}}
        response = await server.post(
            f"/api/v1/namespaces/{NS}/configmaps", json={**config_map, "data": {"greeting": "hello"}}
        )
        assert response.status == 201
        await create(
            server,
            manifest(
                "adder",
                HANDLER,
                volumes=[{"name": "extra", "configMap": {"name": "extra"}}],
                volumeMounts=[{"name": "extra", "mountPath": "/etc/extra", "readOnly": True}],
            ),
        )
        (pod,) = await ready_pods(cluster, "adder", 1)
        path = cluster.host_path(pod.name, "/etc/extra/greeting")
        assert path.read_text() == "hello"
        assert os.readlink(path) == "..data/greeting"
        first = os.readlink(path.parent / "..data")
        assert first.startswith("..") and (path.parent / first / "greeting").is_file()

        await patch(server, f"/api/v1/namespaces/{NS}/configmaps/extra", {"data": {"greeting": "bonjour"}})
        await eventually(lambda: path.read_text() == "bonjour", timeout_s=30, what="the new content")
        assert os.readlink(path) == "..data/greeting"  # the same path; `..data` was swapped under it
        assert os.readlink(path.parent / "..data") != first
        assert not (path.parent / first).exists()  # the old version is cleaned up
        (still,) = cluster.pods("adder")
        assert (still.name, still.pid, still.restarts) == (pod.name, pod.pid, 0)  # no restart needed


@pytest.mark.slow  # real replica processes
async def test_a_container_that_exits_is_restarted_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with stack(tmp_path, monkeypatch) as (server, cluster):
        await create(server, manifest("adder", HANDLER))
        (pod,) = await ready_pods(cluster, "adder", 1)
        assert pod.pid is not None
        os.kill(pod.pid, 9)
        await eventually(
            lambda: (view := cluster.pod(pod.name)) is not None and not view.ready,
            what="the pod to turn unready",
        )
        again = await eventually(
            lambda: (view := cluster.pod(pod.name)) is not None and view.ready and view,
            timeout_s=START_S,
            what="the container to be restarted",
        )
        assert again.restarts == 1 and again.pid not in (None, pod.pid)
        assert cluster.exit_codes(pod.name) == [137]
        stored = server.get_object("pods", NS, pod.name)
        assert stored is not None
        (container,) = stored["status"]["containerStatuses"]
        assert container["restartCount"] == 1
        assert container["lastState"]["terminated"]["exitCode"] == 137


@pytest.mark.slow  # real replica processes
async def test_deleting_the_resource_stops_its_pods_gracefully(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with stack(tmp_path, monkeypatch) as (server, cluster):
        await create(server, manifest("adder", HANDLER))
        (pod,) = await ready_pods(cluster, "adder", 1)
        response = await server.delete(f"{CR_PATH.format(ns=NS)}/adder")
        assert response.status == 200
        # Garbage collection: resource -> Deployment -> pod, which the kubelet stops before it goes.
        await eventually(lambda: not server.list_objects("pods"), timeout_s=30, what="the pod to go")
        assert cluster.exit_codes(pod.name) == [0], cluster.log(pod.name)
