"""The cluster's DNS: CoreDNS (built from its Go module), serving `cluster.local` from the API
server's Services and EndpointSlices, on the cluster's own address on this machine. The kubelets
hand that address to every pod (`clusterDNS`), so pods find `kubernetes.default.svc` and each
other's Services by name, as on any cluster; nothing is forwarded outside."""

from __future__ import annotations

import yaml

from batchd.testing.kubernetes.controlplane import ControlPlane, certificate_user, kubeconfig
from batchd.testing.kubernetes.processes import Process
from batchd.testing.waiting import answers_ok

USER = "batchd-test-coredns"
# What CoreDNS's kubernetes plugin reads (the rules of the system:coredns role kubeadm installs).
RBAC = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": USER},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": USER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    },
]


def start_dns(cluster: ControlPlane) -> Process:
    """CoreDNS for `cluster`, on port 53 of the API server's address."""
    directory = cluster.directory / "coredns"
    directory.mkdir(exist_ok=True)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(RBAC))
    config = directory / "kubeconfig"
    credential = cluster.ca.issue("coredns", USER)
    config.write_text(
        yaml.safe_dump(kubeconfig(cluster.server, cluster.ca.cert, user=certificate_user(credential)))
    )
    corefile = directory / "Corefile"
    corefile.write_text(
        f""".:53 {{
    bind {cluster.address}
    errors
    ready {cluster.address}:8181
    kubernetes cluster.local in-addr.arpa {{
        kubeconfig {config}
        pods insecure
        fallthrough in-addr.arpa
    }}
    cache 5
}}
"""
    )
    process = Process.start(
        "coredns",
        [cluster.tools["coredns"], "-conf", str(corefile)],
        directory / "coredns.log",
        cwd=directory,
    )
    cluster.processes["coredns"] = process
    cluster.wait_for(lambda: _ready(cluster), what="CoreDNS to be ready")
    return process


def _ready(cluster: ControlPlane) -> bool:
    return answers_ok(f"http://{cluster.address}:8181/ready")
