"""The operator stopped midway and started again, on a real cluster: it picks up what changed while
it was away and creates nothing twice (every create is in the API server's audit log); stopped in
the middle of a rolling update, the update finishes once, on the spec of the moment, and no
request is lost."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from batchd.api.pod import config_map_name
from batchd.testing.closed_loop import SteadyLoad
from batchd.testing.kubernetes import handlers
from batchd.testing.kubernetes.components import refused
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import ONE_ROUTER, Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow


def creates(release: Release, resource: str) -> int:
    """How many `resource` objects the operator made in the release's namespace (its ClusterRole
    lets it act on every namespace of the session's cluster, where other tests' deployments live
    and go). It applies its children: an apply that made the object is answered 201 Created."""
    return sum(
        1
        for event in release.cluster.audit_events(release.operator_user)
        if event["verb"] in ("create", "patch")
        and event["stage"] == "ResponseComplete"
        and event.get("responseStatus", {}).get("code") == 201
        and event.get("objectRef", {}).get("resource") == resource
        and not event["objectRef"].get("subresource")
        and event["objectRef"].get("namespace") == release.namespace
    )


def test_operator_restarted_midway_makes_no_duplicates(control_plane: ControlPlane, tmp_path: Path) -> None:
    with installed(control_plane, tmp_path) as release:
        ns = release.namespace

        def apply(name: str) -> None:
            release.apply(manifest(name))

        with release.operator(tmp_path / "operator.log"):
            for name in ("one", "two", "three"):
                apply(name)
            eventually(lambda: release.get("deployment", "one"), what="the first Deployment")
        # Stopped in the middle; meanwhile a child goes away and a resource is added.
        control_plane.kubectl("delete", "-n", ns, "service/one")
        apply("four")
        with release.operator(tmp_path / "operator.log"):
            for name in ("one", "two", "three", "four"):
                for kind, child in (
                    ("deployment", name),
                    ("service", name),
                    ("configmap", config_map_name(name)),
                ):
                    eventually(partial(release.get, kind, child), what=f"{kind} {child}")
                eventually(partial(status_of, release, name), what=f"status of {name}")
        assert creates(release, "deployments") == 4  # each created once, across both runs
        assert creates(release, "services") == 5  # and the one deleted, once more
        assert refused(control_plane, release.operator_user, namespace=ns) == []


SLOW = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0.02}}


def rollout(release: Release, name: str) -> tuple[int, int, int, str]:
    """(replicas, updated, available, revision) of the deployment's Deployment."""
    deployment = release.get("deployment", name) or {}
    state = deployment.get("status", {})
    revision = (
        deployment.get("metadata", {}).get("annotations", {}).get("deployment.kubernetes.io/revision", "")
    )
    return (
        state.get("replicas", 0),
        state.get("updatedReplicas", 0),
        state.get("availableReplicas", 0),
        revision,
    )


def test_operator_restarted_during_a_rolling_update_finishes_it_once(
    control_plane: ControlPlane, kube_node: Node, tmp_path: Path
) -> None:
    with installed(control_plane, tmp_path, ONE_ROUTER) as release:
        ns = release.namespace
        release.apply(handlers.config_map())

        def apply(model: dict[str, Any], **spec: Any) -> None:
            document = manifest("rolled", model, **handlers.pod_spec(), **spec)
            release.apply(document)

        with release.operator(tmp_path / "operator.log"):
            apply(SLOW, num_replicas=2)
            control_plane.kubectl("wait", "-n", ns, "--for=condition=Ready", "bd/rolled", "--timeout=180s")
        predict = f"{release.service_url('rolled', 8000)}/v1/models/rolled:predict"
        with SteadyLoad(predict) as load:
            eventually(lambda: load.outcomes[200] >= 20, what="load before the update")
            with release.operator(tmp_path / "operator.log"):
                # A new model rolls the pods; the operator stops as soon as the new ReplicaSet has begun.
                apply({**SLOW, "init_kwargs": {"delay_s": 0.03}}, num_replicas=2)
                eventually(lambda: rollout(release, "rolled")[3] == "2", what="the rolling update to begin")
            assert rollout(release, "rolled")[1] < 2, "the rollout finished before the operator stopped"
            # While it is away the user scales too.
            control_plane.kubectl("scale", "-n", ns, "bd/rolled", "--replicas=3")
            with release.operator(tmp_path / "operator.log"):
                eventually(
                    lambda: rollout(release, "rolled")[:3] == (3, 3, 3),
                    timeout_s=240,
                    what="3 updated replicas",
                )
                control_plane.kubectl(
                    "wait", "-n", ns, "--for=condition=Ready", "bd/rolled", "--timeout=120s"
                )
                bd = release.get("bd", "rolled") or {}
            served = load.outcomes[200]
            eventually(lambda: load.outcomes[200] >= served + 20, what="load after the update")
        # Every request answered, by the old pods or the new: the update drained each old one.
        assert set(load.outcomes) == {200}, load.outcomes
        # One rolling update: the restarted operator did not roll the pods again (a third revision).
        assert rollout(release, "rolled")[3] == "2"
        assert bd["status"]["observed_generation"] == bd["metadata"]["generation"]
        assert creates(release, "deployments") == 1
        assert refused(control_plane, release.operator_user, namespace=ns) == []


def status_of(release: Release, name: str) -> dict[str, Any] | None:
    found = release.get("bd", name)
    return None if found is None else found.get("status")
