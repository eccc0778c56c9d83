"""Operator chaos on a real control plane: the operator process is killed (SIGKILL) at random
moments, six times, while 50 resources are created, scaled, edited and deleted through the API
server. Each time it comes back it must converge: every resource's children exactly as its spec
asks, no duplicate, no orphan, once the real garbage collector has removed what deleted resources
owned.

The operator runs as a user runs it (`python -m batchd.operator`, its own process) on the chart's
ServiceAccount token; the workload is seeded, so the order of changes replays (the moments the
API server answers do not). The pods ask for a node nobody has: this is about the operator's
bookkeeping, and 100 replicas would not fit a test node.
"""

from __future__ import annotations

import random
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchd.api.manifest import parse_manifest
from batchd.api.pod import config_map_name
from batchd.api.revisions import batching_revision_of
from batchd.operator import children
from batchd.testing.kubernetes.components import forbidden
from batchd.testing.kubernetes.controlplane import ControlPlane, namespace, unique_name
from batchd.testing.kubernetes.release import installed
from batchd.testing.manifests import manifest
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow

RESOURCES = 50
KILLS = 6
SEED = 20261123
NOWHERE = {"batchd.dev/test-node": "none"}  # no node has this label: the pods stay Pending
BDS = "/apis/serving.batchd.dev/v1alpha1/namespaces/{ns}/batcheddeployments"
CHILDREN = {
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Service": "/api/v1/namespaces/{ns}/services",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
}
NOT_CHILDREN = {"kube-root-ca.crt"}  # the API server's own ConfigMap in every namespace
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


def workload(api: httpx.Client, ns: str, rng: random.Random, stop: threading.Event) -> int:
    """Create, scale, edit and delete the resources at random until told to stop; returns the
    number of changes made (each is a real API request, refused ones included)."""
    changes = 0
    collection = BDS.format(ns=ns)
    while not stop.is_set():
        name = f"chaos-{rng.randrange(RESOURCES):02d}"
        path = f"{collection}/{name}"
        exists = api.get(path).status_code == 200
        action = rng.choice(["create", "scale", "scale-subresource", "batching", "model", "delete"])
        if not exists or action == "create":
            api.post(collection, json=manifest(name, num_replicas=rng.randrange(4), nodeSelector=NOWHERE))
        elif action == "scale":
            api.patch(path, json={"spec": {"num_replicas": rng.randrange(5)}}, headers=MERGE_PATCH)
        elif action == "scale-subresource":
            api.patch(f"{path}/scale", json={"spec": {"replicas": rng.randrange(5)}}, headers=MERGE_PATCH)
        elif action == "batching":
            batching = {"max_batch_size": rng.choice([1, 8, 32])}
            api.patch(path, json={"spec": {"batching": batching}}, headers=MERGE_PATCH)
        elif action == "model":
            model = {"init_kwargs": {"seed": rng.randrange(100)}}
            api.patch(path, json={"spec": {"model": model}}, headers=MERGE_PATCH)
        else:
            api.delete(path)
        changes += 1
        stop.wait(rng.uniform(0.005, 0.03))  # a user's pace: the operator must keep up
    return changes


def listed(api: httpx.Client, path: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get(path).raise_for_status().json()["items"]
    return items


def drift(api: httpx.Client, ns: str) -> list[str]:
    """Everything that differs from what the live resources ask for: missing or wrong children,
    children no resource owns (orphans), and statuses that lag their spec."""
    problems = []
    live = {bd["metadata"]["name"]: bd for bd in listed(api, BDS.format(ns=ns))}
    found = {
        kind: {child["metadata"]["name"]: child for child in listed(api, path.format(ns=ns))}
        for kind, path in CHILDREN.items()
    }
    for name, body in live.items():
        bd = parse_manifest({key: body[key] for key in ("apiVersion", "kind", "metadata", "spec")})
        status = body.get("status") or {}
        if status.get("observed_generation") != body["metadata"]["generation"]:
            problems.append(f"{name}: status describes generation {status.get('observed_generation')}")
        deployment = found["Deployment"].get(name)
        if deployment is None:
            problems.append(f"{name}: no Deployment")
        else:
            if deployment["spec"]["replicas"] != bd.spec.num_replicas:
                problems.append(
                    f"{name}: {deployment['spec']['replicas']} replicas, spec asks {bd.spec.num_replicas}"
                )
            template = deployment["spec"]["template"]
            image = template["spec"]["containers"][0]["image"]
            if template["metadata"]["annotations"][children.CONFIG_HASH_ANNOTATION] != children.pod_hash(
                bd, image
            ):
                problems.append(f"{name}: the pod template is not the spec's")
        config = found["ConfigMap"].get(config_map_name(name))
        revision = batching_revision_of(bd.spec.batching)
        if config is None or config["data"] != children.config_map(bd, revision)["data"]:
            problems.append(f"{name}: the replicas' manifest is not the spec's")
        if (status.get("batching") or {}).get("revision") != revision:
            problems.append(f"{name}: status.batching does not name the spec's batching revision")
        for kind in ("Service", "PodDisruptionBudget"):
            if name not in found[kind]:
                problems.append(f"{name}: no {kind}")
    for kind, objects in found.items():
        for child_name, child in objects.items():
            if child_name in NOT_CHILDREN:
                continue
            owners = [ref["name"] for ref in child["metadata"].get("ownerReferences", [])]
            if len(owners) != 1 or owners[0] not in live:
                problems.append(f"orphan {kind} {child_name} (owners {owners})")
            elif child_name not in (owners[0], config_map_name(owners[0])):
                problems.append(f"duplicate {kind} {child_name} of {owners[0]}")
    return problems


def test_a_repeatedly_killed_operator_converges_with_no_duplicate_and_no_orphan(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    log = tmp_path / "operator.log"
    with (
        installed(control_plane, tmp_path) as release,
        namespace(control_plane, unique_name("chaos")) as ns,
        control_plane.client() as api,
    ):
        stop = threading.Event()
        made: list[int] = []

        def change() -> None:
            with control_plane.client() as own:  # httpx's clients are not shared between threads
                made.append(workload(own, ns, rng, stop))

        changes = threading.Thread(target=change, daemon=True)
        changes.start()
        try:
            for _ in range(KILLS):
                with release.operator(log) as operator:
                    stop.wait(rng.uniform(0.2, 2.0))  # a random moment in its work
                    operator.send_signal(signal.SIGKILL)
                    operator.wait()
            # Changes the dead operator has not made yet: the restart below has work to do.
            eventually(
                lambda: drift(api, ns), timeout_s=30, interval_s=0.5, what="changes left undone by the kills"
            )
        finally:
            stop.set()
            changes.join(timeout=30)
        # Back for good: it must converge on what the resources ask for now.
        left: list[str] = []

        def converged() -> bool:
            left[:] = drift(api, ns)
            return not left

        with release.operator(log):
            try:
                eventually(converged, timeout_s=90, interval_s=0.5, what="convergence after the last kill")
            except AssertionError as timeout:
                raise AssertionError(f"{timeout}; still different: {left}") from None
        assert made and made[0] > 100, made
        assert len(listed(api, BDS.format(ns=ns))) > RESOURCES // 4
        assert forbidden(control_plane, release.operator_user) == []
