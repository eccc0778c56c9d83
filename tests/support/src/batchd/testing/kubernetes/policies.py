"""NetworkPolicy enforced on a test node: kube-router's policy controller (`--run-firewall` alone)
in the node's network namespace, where it writes the iptables and ipset rules of the cluster's
NetworkPolicies for the node's pods. The node's bridge CNI and kube-proxy stay as they are.

kube-router is a test part only (tools/build-kube-router.sh says why). It runs as a user of its
own (a client certificate) with the read access its controller needs, and on exit removes every
rule it wrote, so the node is as it was for the tests that come after.
"""

from __future__ import annotations

import contextlib
import functools
import re
import subprocess
import time
from collections.abc import Iterator

import yaml

from batchd.testing import ROOT
from batchd.testing.kubernetes.controlplane import certificate_user, kubeconfig
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.processes import Process, run

BUILD_SCRIPT = ROOT / "tools" / "build-kube-router.sh"
USER = "batchd-test:kube-router"
START_TIMEOUT_S = 90.0
# What the policy controller logs (at -v=2) each time its rules match the cluster's policies.
SYNCED = "Iptables chains in the filter table are synchronized with the network policies"
# The filter-table chains its policy controller writes (kube-proxy's own KUBE-* chains stay).
OWN_CHAINS = re.compile(r"KUBE-(ROUTER|POD-FW|NWPLCY)-")
# What its controller reads: the policies, and the pods and namespaces they select.
RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods", "namespaces", "nodes", "services", "endpoints"],
        "verbs": ["get", "list", "watch"],
    },
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
]


@functools.cache
def kube_router() -> str:
    """The kube-router binary, built first if it is not in the cache yet (`make kube-router`)."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result.stdout.strip().splitlines()[-1]


def _grant(node: Node) -> None:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "batchd-test-kube-router"},
        "rules": RULES,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "batchd-test-kube-router"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "batchd-test-kube-router",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }
    node.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([role, binding]))


@contextlib.contextmanager
def enforced(node: Node) -> Iterator[Process]:
    """NetworkPolicies enforced on `node` while the block runs: the block starts once the
    controller's rules match the cluster's policies (a policy applied later is enforced at the
    controller's next sync, within seconds)."""
    cluster = node.cluster
    _grant(node)
    identity = cluster.ca.issue(f"{node.name}-kube-router", USER)
    config = node.directory / "kube-router.kubeconfig"
    config.write_text(
        yaml.safe_dump(kubeconfig(cluster.server, cluster.ca.cert, user=certificate_user(identity)))
    )
    process = node.start_process(
        "kube-router",
        [
            kube_router(),
            f"--kubeconfig={config}",
            "--enable-ipv4=true",
            "--enable-ipv6=false",
            "--run-firewall=true",
            "--run-router=false",
            "--run-service-proxy=false",
            "--enable-cni=false",
            f"--hostname-override={node.name}",
            f"--service-cluster-ip-range={cluster.addresses.service_cidr}",
            "--iptables-sync-period=5s",
            "--health-port=0",
            "--metrics-port=0",
            "--v=2",
        ],
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while SYNCED not in process.log.read_text(errors="replace"):
            if process.popen.poll() is not None:
                raise RuntimeError(f"kube-router exited ({process.popen.returncode}):\n{process.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"kube-router wrote no rules in {START_TIMEOUT_S:.0f} s:\n{process.tail()}"
                )
            time.sleep(0.2)
        yield process
    finally:
        process.stop()
        remove_rules(node)


def remove_rules(node: Node) -> None:
    """Every rule and set the policy controller wrote in the node's namespace. Its own
    `--cleanup-config` removes nothing in v2.1.0 (it cleans up a controller it never configured)."""
    saved = run(node.in_node(["iptables-save", "-t", "filter"])).stdout
    kept = "".join(line for line in saved.splitlines(keepends=True) if not OWN_CHAINS.search(line))
    run(node.in_node(["iptables-restore"]), input=kept)
    # Only the controller makes sets in a node's namespace (kube-proxy's iptables mode uses none).
    run(node.in_node(["ipset", "destroy"]), check=False)
