"""Operator chaos: the operator process is killed (SIGKILL) at random moments, ten times, while 50
resources are created, scaled, edited and deleted. Each time it comes back it must converge:
every resource's children exactly as its spec asks, no duplicate, no orphan.

The operator runs as a user runs it (`python -m batchd.operator`, its own process) against the
emulated API server; the workload is seeded, so a failure replays.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from batchd.api.manifest import parse_manifest
from batchd.operator import children
from batchd.operator.settings import Settings
from batchd.testing.apiserver import ApiServer
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import CR_PATH, api_server, eventually, operator_process

pytestmark = pytest.mark.slow

NS = "default"
RESOURCES = 50
KILLS = 6
SEED = 20261123
CHILD_KINDS = ("apps/deployments", "services", "configmaps", "policy/poddisruptionbudgets")


async def workload(server: ApiServer, rng: random.Random, stop: asyncio.Event) -> int:
    """Create, scale, edit and delete the resources at random until told to stop; returns the
    number of changes made (each is a real API request, refused ones included)."""
    changes = 0
    while not stop.is_set():
        name = f"chaos-{rng.randrange(RESOURCES):02d}"
        path = f"{CR_PATH.format(ns=NS)}/{name}"
        exists = server.get_object("serving.batchd.dev/batcheddeployments", NS, name) is not None
        action = rng.choice(["create", "scale", "scale-subresource", "batching", "model", "delete"])
        if not exists or action == "create":
            await server.post(CR_PATH.format(ns=NS), json=manifest(name, num_replicas=rng.randrange(4)))
        elif action == "scale":
            await _patch(server, path, {"spec": {"num_replicas": rng.randrange(5)}})
        elif action == "scale-subresource":
            await _patch(server, f"{path}/scale", {"spec": {"replicas": rng.randrange(5)}})
        elif action == "batching":
            await _patch(server, path, {"spec": {"batching": {"max_batch_size": rng.choice([1, 8, 32])}}})
        elif action == "model":
            await _patch(server, path, {"spec": {"model": {"init_kwargs": {"seed": rng.randrange(100)}}}})
        else:
            await server.delete(path)
        changes += 1
        await asyncio.sleep(rng.uniform(0.005, 0.03))  # a user's pace: the operator must keep up
    return changes


async def _patch(server: ApiServer, path: str, body: dict[str, Any]) -> None:
    await server.patch(path, data=json.dumps(body), headers={"Content-Type": "application/merge-patch+json"})


def drift(server: ApiServer) -> list[str]:
    """Everything that differs from what the live resources ask for: missing or wrong children,
    children no resource owns (orphans), and statuses that lag their spec."""
    problems = []
    settings = Settings()
    live = {
        bd["metadata"]["name"]: bd for bd in server.list_objects("serving.batchd.dev/batcheddeployments", NS)
    }
    for name, body in live.items():
        bd = parse_manifest({key: body[key] for key in ("apiVersion", "kind", "metadata", "spec")})
        status = body.get("status") or {}
        if status.get("observed_generation") != body["metadata"]["generation"]:
            problems.append(f"{name}: status describes generation {status.get('observed_generation')}")
        deployment = server.get_object("apps/deployments", NS, name)
        expected = children.deployment(bd, settings)
        if deployment is None:
            problems.append(f"{name}: no Deployment")
        else:
            if deployment["spec"]["replicas"] != bd.spec.num_replicas:
                problems.append(
                    f"{name}: {deployment['spec']['replicas']} replicas, spec asks {bd.spec.num_replicas}"
                )
            want = expected["spec"]["template"]["metadata"]["annotations"]
            have = deployment["spec"]["template"]["metadata"]["annotations"]
            if have[children.CONFIG_HASH_ANNOTATION] != want[children.CONFIG_HASH_ANNOTATION]:
                problems.append(f"{name}: the pod template is not the spec's")
        config = server.get_object("configmaps", NS, children.config_map_name(name))
        revision = (status.get("batching") or {}).get("revision", 0)
        if config is None or config["data"] != children.config_map(bd, revision)["data"]:
            problems.append(f"{name}: the replicas' manifest is not the spec's")
        if server.get_object("services", NS, name) is None:
            problems.append(f"{name}: no Service")
        if server.get_object("policy/poddisruptionbudgets", NS, name) is None:
            problems.append(f"{name}: no PodDisruptionBudget")
    for kind in CHILD_KINDS:
        for child in server.list_objects(kind, NS):
            child_name = child["metadata"]["name"]
            owners = [ref["name"] for ref in child["metadata"].get("ownerReferences", [])]
            if len(owners) != 1 or owners[0] not in live:
                problems.append(f"orphan {kind} {child_name} (owners {owners})")
            elif child_name not in (owners[0], children.config_map_name(owners[0])):
                problems.append(f"duplicate {kind} {child_name} of {owners[0]}")
    return problems


async def test_a_repeatedly_killed_operator_converges_with_no_duplicate_and_no_orphan(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    log = tmp_path / "operator.log"
    async with api_server(tmp_path) as server:
        stop = asyncio.Event()
        changes = asyncio.create_task(workload(server, rng, stop))
        try:
            for _ in range(KILLS):
                async with operator_process(server, log) as operator:
                    await asyncio.sleep(rng.uniform(0.2, 2.0))  # a random moment in its work
                    operator.send_signal(signal.SIGKILL)
                    await operator.wait()
            # Changes the dead operator has not made yet: the restart below has work to do.
            await eventually(lambda: drift(server), timeout_s=30, what="changes left undone by the kills")
        finally:
            stop.set()
            made = await changes
        # Back for good: it must converge on what the resources ask for now.
        async with operator_process(server, log):
            await eventually(lambda: not drift(server), timeout_s=60, what="convergence after the last kill")
        assert made > 100, made
        assert len(server.list_objects("serving.batchd.dev/batcheddeployments", NS)) > RESOURCES // 4
