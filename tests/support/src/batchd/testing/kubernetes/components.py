"""batchd's operator and router as the chart deploys them, run as processes of this machine against
a real control plane: the environment of the chart's own Deployment, and a kubeconfig holding a
token of the chart's ServiceAccount, so the API server's RBAC judges every call they make.

(In pods on a node they get the same from the kubelet: the environment, and the projected token.)
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.waiting import eventually

# The local processes serve no metrics or health endpoint: nothing listens that a test does not
# call, and two test workers never race for the chart's fixed ports.
LOCAL_OVERRIDES = {"BATCHD_METRICS_PORT": "0", "BATCHD_LIVENESS_ENDPOINT": ""}


def chart_deployment(cluster: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        cluster.kubectl("get", "deployment", name, "-n", namespace, "-o", "json").stdout
    )
    return document


def scaled_to_zero(deployment: dict[str, Any]) -> bool:
    """Whether the deployment controller has acted on a scale to zero: it records the generation it
    acted on once its ReplicaSets have their new size."""
    observed: int = deployment.get("status", {}).get("observedGeneration", 0)
    generation: int = deployment["metadata"]["generation"]
    return deployment["spec"].get("replicas") == 0 and observed >= generation


def container_env(deployment: dict[str, Any]) -> dict[str, str]:
    """The first container's environment (literal values, the only kind the chart sets; the API
    server stores an empty value as no value)."""
    env = {}
    for variable in deployment["spec"]["template"]["spec"]["containers"][0].get("env", []):
        if "valueFrom" in variable:
            raise ValueError(f"{variable['name']} is not a literal value: {variable}")
        env[variable["name"]] = variable.get("value", "")
    return env


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def call(event: dict[str, Any]) -> tuple[str, str, str]:
    """(API group, resource[/subresource], verb) of the request an audit event records."""
    ref = event.get("objectRef", {})
    resource = "/".join(filter(None, [ref.get("resource"), ref.get("subresource")]))
    return ref.get("apiGroup", ""), resource, event["verb"]


def refused(cluster: ControlPlane, user: str, *, since: int = 0, namespace: str | None = None) -> list[str]:
    """Every request of `user` the API server refused for want of a permission (RBAC's decision
    `forbid`, not a 403 for a namespace being deleted) or as invalid (422), from its `since`-th
    request on (in `namespace` only, if given), as 'code verb group/resource[/subresource] URI'."""
    found = []
    for event in cluster.audit_events(user)[since:]:
        code = event.get("responseStatus", {}).get("code")
        if namespace is not None and event.get("objectRef", {}).get("namespace") != namespace:
            continue
        if code == 422 or (code == 403 and _decision(event) == "forbid"):
            group, resource, verb = call(event)
            found.append(f"{code} {verb} {group}/{resource} {event.get('requestURI', '')}")
    return found


def forbidden(cluster: ControlPlane, user: str, *, since: int = 0) -> list[str]:
    """Every request of `user` that RBAC refused."""
    return [call for call in refused(cluster, user, since=since) if call.startswith("403 ")]


def _decision(event: dict[str, Any]) -> str:
    return str((event.get("annotations") or {}).get("authorization.k8s.io/decision", ""))


def watching(cluster: ControlPlane, user: str, resource: str) -> bool:
    return any(
        e["verb"] == "watch" and e.get("objectRef", {}).get("resource") == resource
        for e in cluster.audit_events(user)
    )


@contextlib.contextmanager
def component_process(
    cluster: ControlPlane,
    namespace: str,
    deployment_name: str,
    command: list[str],
    log_path: Path,
    *,
    watches: str,
    env: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `command` with the environment and ServiceAccount of the chart's Deployment
    `deployment_name`, in place of that Deployment's pods (scaled to zero meanwhile: two operators
    would both act on every change); yield once the API server has seen it watch `watches`; stop
    it after, and give the Deployment its pods back."""
    deployment = chart_deployment(cluster, namespace, deployment_name)
    replicas = deployment["spec"].get("replicas", 1)
    cluster.kubectl("scale", "-n", namespace, f"deployment/{deployment_name}", "--replicas=0")
    # Until the deployment controller has scaled its ReplicaSet down too, that ReplicaSet may still
    # make a pod after the delete below, which would then go the slow way (started, then drained).
    eventually(
        lambda: scaled_to_zero(chart_deployment(cluster, namespace, deployment_name)),
        timeout_s=timeout_s,
        interval_s=0.5,
        what=f"the deployment controller to scale {deployment_name} to zero",
    )
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    # Their graceful drain is not what a test of the stand-in waits for.
    cluster.kubectl("delete", "pod", "-n", namespace, "-l", selector, "--grace-period=0", "--force")
    cluster.kubectl("wait", "-n", namespace, "--for=delete", "pod", "-l", selector, "--timeout=60s")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    full_env = {
        **os.environ,
        **container_env(deployment),
        **LOCAL_OVERRIDES,
        "KUBECONFIG": str(cluster.service_account_kubeconfig(namespace, account)),
        **(env or {}),
    }
    user = service_account_user(namespace, account)
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not watching(cluster, user, watches):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{command[-1]} did not watch {watches} (exit {process.returncode}):\n"
                    + log_path.read_text(errors="replace")[-4000:]
                )
            time.sleep(0.1)
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        cluster.kubectl("scale", "-n", namespace, f"deployment/{deployment_name}", f"--replicas={replicas}")


def operator_command() -> list[str]:
    return [sys.executable, "-m", "batchd.operator"]
