"""The chart installed with `helm install` on a real control plane, as a user installs it, and what
the tests read back of it."""

from __future__ import annotations

import contextlib
import functools
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from batchd.api.kube_connection import resource_path
from batchd.api.pod import (
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    ROUTER_ADMIN_PORT,
    ROUTER_COMPONENT,
    STABLE,
    Track,
    selector_string,
)
from batchd.api.spec import GROUP, PLURAL, VERSION
from batchd.testing import ROOT
from batchd.testing.kubernetes.components import (
    chart_deployment,
    component_process,
    operator_command,
    service_account_user,
)
from batchd.testing.kubernetes.controlplane import ControlPlane, namespace, unique_name
from batchd.testing.kubernetes.logs import ComponentLogs, watched
from batchd.testing.pods import is_ready, is_terminating
from batchd.testing.servers import router_command
from batchd.testing.waiting import eventually

CHART = ROOT / "charts" / "batchd"
# The kinds tests read, by the names kubectl gives them: (apiVersion, plural, namespaced).
KINDS: dict[str, tuple[str, str, bool]] = {
    "bd": (f"{GROUP}/{VERSION}", PLURAL, True),
    "deployment": ("apps/v1", "deployments", True),
    "service": ("v1", "services", True),
    "pod": ("v1", "pods", True),
    "event": ("v1", "events", True),
    "configmap": ("v1", "configmaps", True),
    "secret": ("v1", "secrets", True),
    "serviceaccount": ("v1", "serviceaccounts", True),
    "networkpolicy": ("networking.k8s.io/v1", "networkpolicies", True),
    "poddisruptionbudget": ("policy/v1", "poddisruptionbudgets", True),
    "clusterrole": ("rbac.authorization.k8s.io/v1", "clusterroles", False),
    "crd": ("apiextensions.k8s.io/v1", "customresourcedefinitions", False),
}
KINDS["batcheddeployment"] = KINDS["bd"]


def get_object(api: httpx.Client, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    """The object as the API server has it, or None if there is none (`kind` as kubectl names it:
    "bd", "deployment", "pod", ...; `namespace` is ignored for a cluster-scoped kind)."""
    api_version, plural, namespaced = KINDS[kind]
    response = api.get(resource_path(api_version, plural, namespace if namespaced else None, name))
    if response.status_code == 404:
        return None
    response.raise_for_status()
    found: dict[str, Any] = response.json()
    return found


def list_objects(api: httpx.Client, kind: str, namespace: str, **params: str) -> list[dict[str, Any]]:
    """The objects of a kind in `namespace` (`params`: labelSelector, fieldSelector)."""
    api_version, plural, _ = KINDS[kind]
    response = api.get(resource_path(api_version, plural, namespace), params=params)
    response.raise_for_status()
    items: list[dict[str, Any]] = response.json()["items"]
    return items


# One router with a small request: a test node's two cores hold the operator, a router and replicas.
ONE_ROUTER: dict[str, Any] = {"router": {"replicaCount": 1, "resources": {"requests": {"cpu": "100m"}}}}


@dataclass(frozen=True)
class Release:
    """One release of the chart, named as its namespace, which it has to itself. The name holds
    "batchd", so the chart names the operator's resources after the release alone."""

    cluster: ControlPlane
    namespace: str
    name: str
    logs: Path
    # The tests' reads, as cluster-admin: one client for all, as tests poll them (a kubectl process
    # a poll would cost the machine more than the poll).
    api: httpx.Client
    # Its operator's and router's logs, checked after each test (`logs`).
    component_logs: ComponentLogs

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object as the API server has it, or None if there is none."""
        return get_object(self.api, kind, name, namespace or self.namespace)

    def apply(self, *documents: dict[str, Any], server_side: bool = False) -> None:
        """`kubectl apply` of these documents into the release's namespace, as a user applies them;
        `server_side` for an object too large for kubectl's last-applied annotation (256 KiB), as a
        user applies one."""
        stream = yaml.safe_dump_all(documents)
        mode = ("--server-side",) if server_side else ()
        self.cluster.kubectl("apply", *mode, "-n", self.namespace, "-f", "-", input=stream)

    def events(self, reason: str, about: str | None = None) -> list[str]:
        """The messages of the events in the namespace with this reason (about the object named
        `about` only, if given)."""
        selector = f"reason={reason}" + (f",involvedObject.name={about}" if about else "")
        return [
            str(event["message"])
            for event in list_objects(self.api, "event", self.namespace, fieldSelector=selector)
        ]

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        """The BatchedDeployment's status condition of this type ({} if none yet)."""
        for condition in ((self.get("bd", name) or {}).get("status") or {}).get("conditions", []):
            if condition["type"] == type_:
                return dict(condition)
        return {}

    def pods(self, deployment: str, *, ready: bool = False, track: Track = STABLE) -> list[dict[str, Any]]:
        """The BatchedDeployment's pods of one track (its stable revision's, or a canary's) that are
        not terminating (with `ready`: and Ready)."""
        return [
            pod
            for pod in list_objects(
                self.api, "pod", self.namespace, labelSelector=selector_string(deployment, track)
            )
            if not is_terminating(pod) and (is_ready(pod) or not ready)
        ]

    def router_url(self) -> str:
        """Where clients reach the release's routers: their Service."""
        return self.service_url(f"{self.name}-router", 80)

    def router_admin_urls(self) -> list[str]:
        """The admin ports (`/metrics`, `GET /held`) of the release's serving router pods, which
        no Service exposes but the monitors'."""
        selector = f"{INSTANCE_LABEL}={self.name},{COMPONENT_LABEL}={ROUTER_COMPONENT[COMPONENT_LABEL]}"
        pods = list_objects(self.api, "pod", self.namespace, labelSelector=selector)
        serving = [pod for pod in pods if is_ready(pod) and not is_terminating(pod)]
        return [f"http://{pod['status']['podIP']}:{ROUTER_ADMIN_PORT}" for pod in serving]

    def router_admin_url(self, timeout_s: float = 120) -> str:
        """The admin port of the release's one serving router pod (`ONE_ROUTER`; waits until there
        is one)."""
        found = eventually(
            lambda: len(urls := self.router_admin_urls()) == 1 and urls,
            timeout_s=timeout_s,
            what=f"one serving router pod of {self.name}",
        )
        return found[0]

    def service_url(self, name: str, port: int) -> str:
        """The address of the Service's port: its ClusterIP, which kube-proxy spreads over the pods."""
        service = self.get("service", name)
        assert service is not None, f"no Service {name} in {self.namespace}"
        return f"http://{service['spec']['clusterIP']}:{port}"

    def first_answer(
        self, url: str, body: dict[str, Any], timeout_s: float = 30, *, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        """The first answer to a POST to a Service's address. A Service's pods being Ready is not
        enough: kube-proxy programs its address on its own next sync, and until then the node
        refuses the connection."""

        def answer() -> httpx.Response | None:
            try:
                return httpx.post(url, json=body, headers=headers, timeout=10)
            except httpx.ConnectError:
                return None

        answered = eventually(answer, timeout_s=timeout_s, what=f"{url} to answer")
        assert answered is not None
        return answered

    # Read once: tests poll the audit log by these names, and each read asks the API server.
    @functools.cached_property
    def operator_user(self) -> str:
        """The operator's ServiceAccount, as the API server names it."""
        return self._user(self.name)

    @functools.cached_property
    def router_user(self) -> str:
        return self._user(f"{self.name}-router")

    def operator(
        self, log_path: Path, env: dict[str, str] | None = None
    ) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
        """The operator as a process of this machine, in place of the release's operator pod."""
        self.component_logs.follow(log_path)
        return component_process(
            self.cluster,
            self.namespace,
            self.name,
            operator_command(),
            log_path,
            watches="batcheddeployments",
            env=env,
        )

    def router(self, log_path: Path, port: int) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
        """The router as a process of this machine on 127.0.0.1:`port`, in place of its pods."""
        self.component_logs.follow(log_path)
        return component_process(
            self.cluster,
            self.namespace,
            f"{self.name}-router",
            [*router_command(), "--port", str(port)],
            log_path,
            watches="endpointslices",
        )

    def _user(self, deployment: str) -> str:
        spec = chart_deployment(self.cluster, self.namespace, deployment)["spec"]["template"]["spec"]
        return service_account_user(self.namespace, spec["serviceAccountName"])


@contextlib.contextmanager
def installed(
    cluster: ControlPlane,
    logs: Path,
    values: dict[str, Any] | None = None,
    *,
    name: str = "",
    wait: bool = False,
) -> Iterator[Release]:
    """`helm install` of the chart with `values` into a new `restricted` namespace, both called
    `name` (default: a new one); with `wait`, until its pods are ready (that needs a node).
    Uninstalled after."""
    name = name or unique_name("batchd")
    with namespace(cluster, name) as ns:
        values_file = logs / f"{name}-values.yaml"
        values_file.write_text(yaml.safe_dump(values or {}))
        waiting = ["--wait", "--timeout=5m"] if wait else []
        cluster.helm("install", name, str(CHART), "--namespace", ns, "--values", str(values_file), *waiting)
        try:
            with cluster.client() as api, watched(ComponentLogs(api, ns, name)) as component_logs:
                yield Release(cluster, ns, name, logs, api, component_logs)
        finally:
            cluster.helm("uninstall", name, "--namespace", ns, check=False)
