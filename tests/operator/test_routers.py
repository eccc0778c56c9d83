"""What the operator makes of the routers' pods and of their `GET /held` answers."""

from __future__ import annotations

from typing import Any

from batchd.operator.autoscaler import Held
from batchd.operator.routers import held_per_deployment, router_pods


def entry(name: str, held: Any, oldest: Any, namespace: str = "ml") -> dict[str, Any]:
    return {
        "namespace": namespace,
        "name": name,
        "model": name,
        "held_requests": held,
        "oldest_held_s": oldest,
    }


def test_what_several_routers_hold_is_summed_per_deployment_with_the_oldest_wait() -> None:
    answers: list[dict[str, Any]] = [
        {"deployments": [entry("a", 2, 1.5), entry("b", 1, 0.2)]},
        {"deployments": [entry("a", 3, 4.0), entry("a", 1, 0.1, namespace="other")]},
        {"deployments": []},
    ]
    assert held_per_deployment(answers) == {
        ("ml", "a"): Held(5, 4.0),
        ("ml", "b"): Held(1, 0.2),
        ("other", "a"): Held(1, 0.1),
    }


def test_entries_that_are_not_what_the_router_documents_are_skipped_not_fatal() -> None:
    answers: list[dict[str, Any]] = [
        {"deployments": [entry("a", "many", 1.0), {"name": "b"}, entry("c", 0, 0.0), entry("d", 2, 0.5)]},
        {"deployments": "none"},
        {},
    ]
    assert held_per_deployment(answers) == {("ml", "d"): Held(2, 0.5)}


def pod(name: str, labels: dict[str, str], ready: bool = True, admin: bool = True) -> dict[str, Any]:
    ports = [{"name": "http", "containerPort": 8080}, *([{"name": "admin", "containerPort": 9090}] * admin)]
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "router", "ports": ports}]},
        "status": {"podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": str(ready)}]},
    }


def test_router_pods_are_the_listed_pods_with_every_selected_label() -> None:
    selector = "app.kubernetes.io/component=router,app.kubernetes.io/instance=batchd"
    ours = {"app.kubernetes.io/component": "router", "app.kubernetes.io/instance": "batchd"}
    listed = {
        "items": [
            pod("router-a", ours),
            pod("router-b", {**ours, "app.kubernetes.io/instance": "other-release"}),
            pod("router-c", ours, ready=False),
            pod("router-d", ours, admin=False),
        ]
    }
    pods = router_pods(listed, selector)
    # /held is read on the admin port, never the clients' one; a router of an earlier release
    # (no admin port) on its http port.
    assert [(p.name, p.ip, p.port, p.serving) for p in pods] == [
        ("router-a", "10.0.0.7", 9090, True),
        ("router-c", "10.0.0.7", 9090, False),
        ("router-d", "10.0.0.7", 8080, True),
    ]
