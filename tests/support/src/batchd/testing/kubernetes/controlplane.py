"""A real Kubernetes control plane for the tests: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, as processes of this machine. The API server listens on the cluster's own address
(`network`), which its nodes' pods reach; everything else on 127.0.0.1.

The API server runs as a cluster's does: RBAC authorization, the default admission plugins
(PodSecurity among them), ServiceAccount tokens signed by its own key. Every component has its own
identity (a client certificate the bootstrap RBAC roles know), the test gets a cluster-admin
kubeconfig, and each component under test gets a kubeconfig with its ServiceAccount's token
(TokenRequest), so what the chart's RBAC does not grant fails as it would on a user's cluster.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import httpx
import yaml

from batchd.api.crd import CRD_NAME, CRD_PATH
from batchd.testing import ROOT
from batchd.testing.kubernetes.network import (
    ClusterAddresses,
    add_cluster_address,
    claim_slot,
    remove_cluster_address,
)
from batchd.testing.kubernetes.pki import CertificateAuthority, Credential, service_account_keys
from batchd.testing.kubernetes.processes import Process, Started, run
from batchd.testing.kubernetes.toolchain import Toolchain, toolchain
from batchd.testing.servers import free_port

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
START_TIMEOUT_S = 90.0

# What the API server records of each request: who, what and the answer's code, for every
# ServiceAccount (the components under test); nothing of the admin's or the control plane's own.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # ResponseStarted: a watch is recorded when it opens, not only when it ends.
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}],
}


def kubeconfig(server: str, ca: Path, *, user: dict[str, str], name: str = "batchd-test") -> dict[str, Any]:
    """A kubeconfig document for one user of the cluster at `server`."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


def certificate_user(credential: Credential) -> dict[str, str]:
    return {"client-certificate": str(credential.cert), "client-key": str(credential.key)}


class ControlPlane(Started):
    """etcd, the API server, the controller manager and the scheduler, started in `directory`.

    `admin_kubeconfig` is cluster-admin (the test's own client, kubectl and helm);
    `service_account_kubeconfig` gives a component the token of a ServiceAccount.
    """

    def __init__(self, directory: Path, addresses: ClusterAddresses, tools: Toolchain | None = None) -> None:
        self.directory = directory
        self.addresses = addresses
        self.tools = tools or toolchain()
        self.address = addresses.api
        self.processes: dict[str, Process] = {}
        self._audit: list[dict[str, Any]] = []
        self._audit_read = 0  # bytes of the audit log already parsed into _audit
        self.port = 0
        self.etcd_port = 0
        self._slot: TextIO | None = None  # held while the cluster has its slot's addresses

    # --- the cluster's files -------------------------------------------------------------------

    def _write_credentials(self) -> None:
        pki = self.directory / "pki"
        self.ca = CertificateAuthority(pki)
        self.serving = self.ca.issue(
            "apiserver",
            "kube-apiserver",
            hosts=(
                self.address,
                self.addresses.kubernetes_service,
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server=True,
            client=False,
        )
        # The API server's identity towards kubelets (`kubectl logs`, `exec`).
        self.kubelet_client = self.ca.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            organizations=("system:masters",),
        )
        self.sa_private, self.sa_public = service_account_keys(pki)
        self.server = f"https://{self.address}:{self.port}"
        self.admin_kubeconfig = self._kubeconfig_file(
            "admin", self.ca.issue("admin", "batchd-test-admin", organizations=("system:masters",))
        )
        self._component_kubeconfigs = {
            name: self._kubeconfig_file(name, self.ca.issue(name, f"system:{name}"))
            for name in ("kube-controller-manager", "kube-scheduler")
        }

    def _kubeconfig_file(self, name: str, credential: Credential) -> Path:
        path = self.directory / f"{name}.kubeconfig"
        path.write_text(
            yaml.safe_dump(kubeconfig(self.server, self.ca.cert, user=certificate_user(credential)))
        )
        return path

    # --- processes -----------------------------------------------------------------------------

    def _start(self, name: str, *args: str) -> Process:
        process = Process.start(name, [self.tools[name], *args], self.directory / f"{name}.log")
        self.processes[name] = process
        return process

    def _start_etcd(self) -> None:
        peer_port = free_port()
        self._start(
            "etcd",
            f"--data-dir={self.directory / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
            "--listen-metrics-urls=",
            # A test cluster's state need not survive a power cut; fsync costs the API seconds.
            "--unsafe-no-fsync",
            "--log-level=warn",
        )

    def _start_apiserver(self) -> None:
        pki = self.directory / "pki"
        audit_policy = self.directory / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self.audit_log = self.directory / "audit.log"
        self._start(
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            f"--secure-port={self.port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={self.serving.cert}",
            f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={self.ca.cert}",
            f"--kubelet-client-certificate={self.kubelet_client.cert}",
            f"--kubelet-client-key={self.kubelet_client.key}",
            f"--kubelet-certificate-authority={self.ca.cert}",
            # A node's name is no host this machine resolves: reach each kubelet (pod logs, exec) at
            # its address, which its serving certificate names.
            "--kubelet-preferred-address-types=InternalIP",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={self.addresses.service_cidr}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={self.sa_public}",
            f"--service-account-signing-key-file={self.sa_private}",
            "--allow-privileged=true",
            f"--audit-policy-file={audit_policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-mode=blocking",
            "--profiling=false",
            "--v=1",
        )

    def _start_controllers(self) -> None:
        self._start(
            "kube-controller-manager",
            f"--kubeconfig={self._component_kubeconfigs['kube-controller-manager']}",
            f"--authentication-kubeconfig={self._component_kubeconfigs['kube-controller-manager']}",
            f"--authorization-kubeconfig={self._component_kubeconfigs['kube-controller-manager']}",
            f"--service-account-private-key-file={self.sa_private}",
            f"--root-ca-file={self.ca.cert}",
            f"--cluster-signing-cert-file={self.ca.cert}",
            f"--cluster-signing-key-file={self.ca.key}",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={self.directory / 'kcm-certs'}",
            "--profiling=false",
            "--v=1",
        )
        self._start(
            "kube-scheduler",
            f"--kubeconfig={self._component_kubeconfigs['kube-scheduler']}",
            f"--authentication-kubeconfig={self._component_kubeconfigs['kube-scheduler']}",
            f"--authorization-kubeconfig={self._component_kubeconfigs['kube-scheduler']}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={self.directory / 'scheduler-certs'}",
            "--profiling=false",
            "--v=1",
        )

    def start(self) -> ControlPlane:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._slot = claim_slot(self.addresses)
        add_cluster_address(self.addresses)
        self.port, self.etcd_port = free_port(self.address), free_port()
        self._write_credentials()
        started = time.monotonic()
        self._start_etcd()
        self._start_apiserver()
        self._wait_ready(started)
        self._start_controllers()
        self.wait_for(
            lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default").status_code == 200,
            what="the controller manager to make the default ServiceAccount",
        )
        self.start_seconds = time.monotonic() - started
        return self

    def _wait_ready(self, started: float) -> None:
        def ready() -> bool:
            self._check_running()
            try:
                return self.get("/readyz").status_code == 200
            except httpx.TransportError:
                return False

        self.wait_for(ready, what="the API server's /readyz")

    def restart_apiserver(self, *, compact: bool = False) -> float:
        """Kill the API server (as a crash or a lost node would) and start it again on the same
        address; with `compact`, etcd drops its history meanwhile, so every watch that comes back
        with an older resourceVersion gets 410 Gone and must list again. Returns how long the API
        server was away (seconds)."""
        process = self.processes.pop("kube-apiserver")
        stopped = time.monotonic()
        process.popen.kill()
        process.stop()
        if compact:
            self._compact_etcd()
        self._start_apiserver()
        self._wait_ready(stopped)
        return time.monotonic() - stopped

    def _compact_etcd(self) -> None:
        # A write first, then a compaction up to it (etcd's JSON gateway): a watcher whose last
        # resourceVersion was the newest revision would otherwise resume without a 410.
        etcd = f"http://127.0.0.1:{self.etcd_port}/v3"
        mark = {"key": base64.b64encode(b"/batchd-test/compaction").decode(), "value": ""}
        written = httpx.post(f"{etcd}/kv/put", json=mark).raise_for_status().json()
        httpx.post(
            f"{etcd}/kv/compaction", json={"revision": written["header"]["revision"], "physical": True}
        ).raise_for_status()

    def _check_running(self) -> None:
        for process in self.processes.values():
            if process.popen.poll() is not None:
                raise RuntimeError(f"{process.name} exited ({process.popen.returncode}):\n{process.tail()}")

    def wait_for(self, condition: Any, *, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_running()
            if condition():
                return
            time.sleep(0.1)
        logs = "\n".join(f"--- {p.name}\n{p.tail(15)}" for p in self.processes.values())
        raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}\n{logs}")

    def stop(self) -> None:
        # In the reverse of their start: what uses the API server, the API server, then its store.
        for process in reversed(self.processes.values()):
            process.stop()
        if self._slot is not None:  # never another run's address, when this one could not claim it
            remove_cluster_address(self.addresses)
            self._slot.close()
            self._slot = None

    def install_crds(self) -> None:
        """batchd's CRD, as `kubectl apply -f crds/` applies it, and served before this returns."""
        self.kubectl("apply", "--server-side", "-f", str(ROOT / CRD_PATH))
        self.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")

    # --- clients -------------------------------------------------------------------------------

    def client(self) -> httpx.Client:
        """An HTTP client for the API as cluster-admin."""
        pki = self.directory / "pki"
        context = ssl.create_default_context(cafile=self.ca.cert)
        context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        return httpx.Client(base_url=self.server, verify=context, timeout=10.0)

    def get(self, path: str) -> httpx.Response:
        with self.client() as client:
            return client.get(path)

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        kubeconfig_path: Path | None = None,
        timeout_s: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl` as cluster-admin (or with `kubeconfig_path`); with `check`, a failure raises
        with kubectl's own message."""
        return run(
            [self.tools["kubectl"], f"--kubeconfig={kubeconfig_path or self.admin_kubeconfig}", *args],
            check=check,
            input=input,
            timeout_s=timeout_s,
        )

    def helm(
        self, *args: str, check: bool = True, timeout_s: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """`helm` as cluster-admin, its state kept in this cluster's folder."""
        helm_home = self.directory / "helm"
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(helm_home),
            "HELM_CACHE_HOME": str(helm_home / "cache"),
            "HELM_CONFIG_HOME": str(helm_home / "config"),
            "HELM_DATA_HOME": str(helm_home / "data"),
        }
        return run(
            [self.tools["helm"], f"--kubeconfig={self.admin_kubeconfig}", *args],
            check=check,
            env=env,
            timeout_s=timeout_s,
        )

    def audit_events(self, username: str | None = None) -> list[dict[str, Any]]:
        """What the API server answered each ServiceAccount's request (or `username`'s), oldest
        first: audit events with `verb`, `objectRef` and `responseStatus.code`."""
        if self.audit_log.exists():
            # Read on from where the last call stopped: tests poll this, and the log grows to MBs.
            with self.audit_log.open("rb") as log:
                log.seek(self._audit_read)
                complete = log.read().rpartition(b"\n")[0]
            if complete:
                self._audit_read += len(complete) + 1
                self._audit.extend(json.loads(line) for line in complete.splitlines() if line)
        return [e for e in self._audit if username is None or e["user"]["username"] == username]

    def created(self, username: str, resource: str) -> int:
        """How many `resource` objects `username` has created (as the audit log has it): the
        TokenReviews a router asked for, say."""
        return sum(
            1
            for event in self.audit_events(username)
            if event["verb"] == "create" and event.get("objectRef", {}).get("resource") == resource
        )

    def service_account_kubeconfig(self, namespace: str, name: str, *, duration: str = "2h") -> Path:
        """A kubeconfig that authenticates as ServiceAccount `namespace/name`, with a token from the
        TokenRequest API, as a pod's projected token would."""
        token = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration}"
        ).stdout.strip()
        path = self.directory / f"sa-{namespace}-{name}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(self.server, self.ca.cert, user={"token": token})))
        return path


def unique_name(prefix: str) -> str:
    """A name no other test of the session uses (namespaces are deleted without waiting)."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@contextlib.contextmanager
def namespace(cluster: ControlPlane, name: str, *, pod_security: str = "restricted") -> Iterator[str]:
    """A namespace for one test, whose pods the PodSecurity admission holds to `pod_security`;
    deleted afterwards (without waiting: its name is never reused)."""
    document = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": pod_security}},
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(document))
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
