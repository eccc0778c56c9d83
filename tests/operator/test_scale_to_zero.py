"""Scale to zero, the operator's side, on a real cluster: what the operator does with what the
routers say they hold (requests held, a router that cannot answer, no router at all, a wake
between two full polls).

The routers are one stand-in router pod whose `GET /held` answer the test sets over the pod
network; the operator finds it as it finds the chart's routers, by a label selector in the
release's namespace. The replicas are real pods of the example adder. The whole path with the
chart's real router, a request waking a deployment at zero: `tests/e2e/test_autoscaling.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.pods import is_ready
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow

POLL_S = 0.25
DELAY_S = 1.0  # scale_to_zero_delay_s
START_S = 90.0  # a replica pod's start, on a node shared with the rest of the suite
STANDIN = "standin-router"
STANDIN_PORT = 8080
# What the operator is told of the routers: the chart's router is off, the stand-in takes its place.
ROUTER_ENV = {
    "BATCHD_ROUTER_URL": f"http://{STANDIN}",
    "BATCHD_ROUTER_SELECTOR": f"app.kubernetes.io/name={STANDIN}",
}
FAST_POLLS = {
    "BATCHD_REPLICA_POLL_INTERVAL_S": str(POLL_S),
    "BATCHD_WAKE_POLL_INTERVAL_S": str(POLL_S),
    "BATCHD_AUTOSCALING_STATUS_INTERVAL_S": str(POLL_S),
}

# The stand-in router: GET /held answers what the last PUT /held set (`status`, `deployments`);
# GET /reads lists when (its monotonic clock) each GET /held came. Python's standard library only.
STANDIN_SERVER = """
import http.server, json, sys, time
state = {"status": 200, "deployments": [], "reads": []}
class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/held":
            state["reads"].append(time.monotonic())
            ok = state["status"] == 200
            body = {"deployments": state["deployments"]} if ok else {"error": "not now"}
            self.answer(state["status"], body)
        else:
            self.answer(200, state["reads"])
    def do_PUT(self):
        state.update(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.answer(200, {})
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("", int(sys.argv[1])), Handler).serve_forever()
"""


def standin_pod(image: str) -> dict[str, Any]:
    container = {
        "name": "router",
        "image": image,
        "command": ["python", "-c", STANDIN_SERVER, str(STANDIN_PORT)],
        "ports": [{"name": "admin", "containerPort": STANDIN_PORT}],
        "readinessProbe": {"httpGet": {"path": "/reads", "port": STANDIN_PORT}, "periodSeconds": 1},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": STANDIN, "labels": {"app.kubernetes.io/name": STANDIN}},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 1},
    }


class Routers:
    """The stand-in router pod, reached at its pod address."""

    def __init__(self, release: Release) -> None:
        pod = release.get("pod", STANDIN)
        assert pod is not None and is_ready(pod)
        self.url = f"http://{pod['status']['podIP']}:{STANDIN_PORT}"

    def hold(self, *deployments: dict[str, Any], status: int = 200) -> None:
        """From now on, GET /held answers `status` with these entries."""
        body = {"status": status, "deployments": list(deployments)}
        httpx.put(f"{self.url}/held", json=body, timeout=5).raise_for_status()

    def _reads(self) -> list[float]:
        reads: list[float] = httpx.get(f"{self.url}/reads", timeout=5).json()
        return reads

    def polled_for(self, seconds: float) -> None:
        """Wait (bounded) until the operator's reads of /held from now on span `seconds`."""
        since = len(self._reads())
        eventually(
            lambda: len(reads := self._reads()) > since + 1 and reads[-1] - reads[since] > seconds,
            what=f"reads of /held over {seconds} s",
        )


@pytest.fixture(scope="module")
def release(
    control_plane: ControlPlane, kube_node: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    """The chart without its router, and the stand-in router pod in the release's namespace."""
    logs = tmp_path_factory.mktemp("scale-to-zero")
    with installed(control_plane, logs, {"router": {"enabled": False}}) as release:
        chart_deployment = release.get("deployment", release.name)
        assert chart_deployment is not None
        image = chart_deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        release.apply(standin_pod(image))
        control_plane.kubectl(
            "wait", "-n", release.namespace, "--for=condition=Ready", f"pod/{STANDIN}", "--timeout=120s"
        )
        yield release


@contextlib.contextmanager
def operator(release: Release, env: dict[str, str]) -> Iterator[Routers]:
    """The operator with these settings, and the stand-in router holding nothing."""
    routers = Routers(release)
    routers.hold()
    env = {**FAST_POLLS, "BATCHD_ROUTER_NAMESPACE": release.namespace, **env}
    with release.operator(release.logs / "operator.log", env=env):
        yield routers


def held(release: Release, name: str, requests: int = 1) -> dict[str, Any]:
    """A router's /held entry for the deployment `name` of the release's namespace."""
    return {
        "namespace": release.namespace,
        "name": name,
        "model": name,
        "held_requests": requests,
        "oldest_held_s": 0.1,
    }


def to_zero(name: str, num_replicas: int = 1) -> dict[str, Any]:
    autoscaling = {
        "min_replicas": 0,
        "max_replicas": 2,
        "target_ongoing_items": 4,
        "scale_to_zero_delay_s": DELAY_S,
    }
    return manifest(name, num_replicas=num_replicas, autoscaling=autoscaling)


def replicas(release: Release, name: str) -> int | None:
    deployment = release.get("deployment", name) or {}
    value = deployment.get("spec", {}).get("replicas")
    return value if isinstance(value, int) else None


def ready_to_poll(release: Release, name: str) -> None:
    """Wait (bounded) for the deployment's one replica pod to be Ready: only then does the operator
    read its load."""
    eventually(
        lambda: len(release.pods(name, ready=True)) == 1, timeout_s=START_S, what=f"{name}: a ready replica"
    )


async def test_requests_held_for_a_deployment_keep_it_from_going_to_zero(release: Release) -> None:
    with operator(release, ROUTER_ENV) as routers:
        routers.hold(held(release, "busy"))
        release.apply(to_zero("busy"))
        await asyncio.to_thread(ready_to_poll, release, "busy")
        # Polls spanning twice the delay, all seeing a held request: still one replica.
        await asyncio.to_thread(routers.polled_for, 2 * DELAY_S)
        assert replicas(release, "busy") == 1 and not release.events("ScaledToZero", about="busy")
        routers.hold()
        await asyncio.to_thread(
            eventually, lambda: replicas(release, "busy") == 0, what="scaled to zero once nothing is held"
        )


async def test_a_router_that_cannot_say_what_it_holds_keeps_the_last_replica(release: Release) -> None:
    with operator(release, ROUTER_ENV) as routers:
        routers.hold(status=500)
        release.apply(to_zero("unsure"))
        await asyncio.to_thread(ready_to_poll, release, "unsure")
        await asyncio.to_thread(routers.polled_for, 2 * DELAY_S)
        assert replicas(release, "unsure") == 1
        routers.hold()
        await asyncio.to_thread(
            eventually,
            lambda: replicas(release, "unsure") == 0,
            what="scaled to zero once the router answers",
        )


async def test_without_a_router_nothing_wakes_so_the_status_says_to_raise_min_replicas(
    release: Release,
) -> None:
    with operator(release, {}):
        release.apply(to_zero("cold", num_replicas=0))

        def scaled_to_zero() -> dict[str, Any] | None:
            """The status (one reading) once it says Ready=False ScaledToZero."""
            status: dict[str, Any] = (release.get("bd", "cold") or {}).get("status") or {}
            ready = [c for c in status.get("conditions", []) if c["type"] == "Ready"]
            return status if ready and ready[0]["reason"] == "ScaledToZero" else None

        status = await asyncio.to_thread(eventually, scaled_to_zero, what="cold: Ready=False ScaledToZero")
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert "no router runs to hold requests" in ready["message"]
        assert status["url"].startswith(f"http://cold.{release.namespace}.svc")


async def test_a_deployment_at_zero_wakes_between_full_polls(release: Release) -> None:
    # Full polls a minute apart: only the wake reads of the routers can start the replica in time.
    with operator(release, {**ROUTER_ENV, "BATCHD_REPLICA_POLL_INTERVAL_S": "60"}) as routers:
        release.apply(to_zero("asleep", num_replicas=0))
        await asyncio.to_thread(
            eventually,
            lambda: release.condition("asleep", "Ready").get("reason") == "ScaledToZero",
            what="asleep: Ready=False ScaledToZero",
        )
        routers.hold(held(release, "asleep"))
        await asyncio.to_thread(
            eventually, lambda: replicas(release, "asleep") == 1, what="woken before the next full poll"
        )
        (woke,) = await asyncio.to_thread(
            eventually,
            lambda: release.events("ScaledFromZero", about="asleep"),
            what="the ScaledFromZero event",
        )
        assert woke.startswith("0 -> 1 replicas: 1 request(s) held by the routers")
