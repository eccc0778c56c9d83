"""The addresses and network namespaces of the test clusters on this machine.

Every address comes from 198.18.0.0/15, the range set aside for benchmarks (RFC 2544), never a
private one. Each cluster (one per pytest worker, `slot`) has its own API server address on this
machine's loopback device, its own Service range, and nodes that are network namespaces joined to
this machine by a veth pair, each with a pod subnet behind a CNI bridge. A node's iptables (the
kube-proxy's Service rules) live in its own namespace, so clusters never touch each other's rules
or this machine's.

    slot s, node n         address
    API server, CoreDNS    198.18.250.(s+1) on lo
    Service range          198.19.(8s).0/21 (the `kubernetes` Service .1), routed to node 0
    node link              198.18.(200+s).(4n) /30: this machine .4n+1, the node .4n+2
    pod subnet             198.18.(8s+n).0/24 (the bridge .1)
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from batchd.testing.kubernetes.processes import run

MAX_SLOTS = 25
MAX_NODES = 8


def worker_slot() -> int:
    """This pytest worker's slot: gw0 is 0, gw1 is 1; a run without workers is 0. Two runs side by
    side (two checkouts of one machine) keep apart by `BATCHD_TEST_SLOT_BASE`, added to it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    slot = int(worker.removeprefix("gw")) if worker.startswith("gw") else 0
    slot += int(os.environ.get("BATCHD_TEST_SLOT_BASE", "0"))
    if slot >= MAX_SLOTS:
        raise ValueError(f"at most {MAX_SLOTS} test workers can each have a cluster, not {worker}")
    return slot


def benchmark_slot() -> int:
    """The slot of a cluster a benchmark starts for itself: counted down from the last, so that it
    never takes a test worker's, even when a worker's test runs the benchmark."""
    return MAX_SLOTS - 1 - worker_slot()


@dataclass(frozen=True)
class ClusterAddresses:
    slot: int

    @property
    def api(self) -> str:
        """Where the API server and the cluster DNS listen on this machine."""
        return f"198.18.250.{self.slot + 1}"

    @property
    def service_cidr(self) -> str:
        """2,046 ClusterIPs: a benchmark's hundreds of BatchedDeployments each have a Service."""
        return f"198.19.{8 * self.slot}.0/21"

    @property
    def kubernetes_service(self) -> str:
        return f"198.19.{8 * self.slot}.1"

    @property
    def pod_cidr(self) -> str:
        """Every node's pod subnet of this cluster."""
        return f"198.18.{8 * self.slot}.0/21"

    def node(self, index: int) -> NodeAddresses:
        if index >= MAX_NODES:
            raise ValueError(f"at most {MAX_NODES} nodes a cluster, not {index + 1}")
        return NodeAddresses(self, index)


@dataclass(frozen=True)
class NodeAddresses:
    cluster: ClusterAddresses
    index: int

    @property
    def name(self) -> str:
        return f"batchd-{self.cluster.slot}-{self.index}"

    @property
    def netns(self) -> str:
        return self.name

    @property
    def host_link(self) -> str:
        """The veth's end on this machine (interface names are at most 15 characters)."""
        return f"bdh{self.cluster.slot}x{self.index}"

    @property
    def host_ip(self) -> str:
        return f"198.18.{200 + self.cluster.slot}.{4 * self.index + 1}"

    @property
    def ip(self) -> str:
        """The node's own address: its kubelet, NodePorts, and where its pods are routed."""
        return f"198.18.{200 + self.cluster.slot}.{4 * self.index + 2}"

    @property
    def pod_subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"198.18.{8 * self.cluster.slot + self.index}.0/24")


def remove_node_network(node: NodeAddresses) -> None:
    """Undo `make_node_network`, including what a killed session left."""
    run(["ip", "route", "del", str(node.pod_subnet)], check=False)
    if node.index == 0:
        run(["ip", "route", "del", node.cluster.service_cidr], check=False)
    run(["ip", "link", "del", node.host_link], check=False)
    run(["ip", "netns", "del", node.netns], check=False)


def make_node_network(node: NodeAddresses) -> None:
    """The node's namespace, its link to this machine, and the routes to its pods (and, through
    node 0, to the cluster's Services)."""
    remove_node_network(node)
    ns = ("ip", "netns", "exec", node.netns)
    run(["ip", "netns", "add", node.netns])
    run(["ip", "link", "add", node.host_link, "type", "veth", "peer", "name", "eth0", "netns", node.netns])
    run(["ip", "addr", "add", f"{node.host_ip}/30", "dev", node.host_link])
    run(["ip", "link", "set", node.host_link, "up"])
    run([*ns, "ip", "addr", "add", f"{node.ip}/30", "dev", "eth0"])
    run([*ns, "ip", "link", "set", "eth0", "up"])
    run([*ns, "ip", "link", "set", "lo", "up"])
    run([*ns, "ip", "route", "add", "default", "via", node.host_ip])
    # A packet for a Service that no rule rewrote goes nowhere (not back out to this machine).
    run([*ns, "ip", "route", "add", "unreachable", node.cluster.service_cidr])
    for sysctl in ("net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"):
        run([*ns, "sysctl", "-qw", sysctl])
    run(["ip", "route", "add", str(node.pod_subnet), "via", node.ip])
    if node.index == 0:
        run(["ip", "route", "add", node.cluster.service_cidr, "via", node.ip])


class SlotInUse(RuntimeError):
    """Another process on this machine runs a cluster on the slot asked for."""


def claim_slot(cluster: ClusterAddresses) -> TextIO:
    """This slot's addresses for this process alone, until the file returned is closed. Another
    test run on the machine that asks for the same slot fails at once, saying who holds it, rather
    than sharing the addresses and removing them from under the first run when it stops."""
    # Per network namespace: a run in a namespace of its own (`make test-fast`) has addresses of
    # its own, and shares no slot with the machine's.
    network = os.stat("/proc/self/ns/net").st_ino
    path = Path(tempfile.gettempdir()) / f"batchd-cluster-slot-{cluster.slot}-net{network}.lock"
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "a process"
        handle.close()
        raise SlotInUse(
            f"cluster slot {cluster.slot} ({cluster.api}) is in use by another test run on this machine "
            f"({holder}): run one suite at a time"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}, since {time.strftime('%H:%M:%S')}\n")
    handle.flush()
    return handle


class NeedsRoot(RuntimeError):
    """The cluster's addresses need root: this machine's, or a network namespace's own."""


def add_cluster_address(cluster: ClusterAddresses) -> None:
    """The API server's address on this machine; pods reach it through their node's link."""
    if os.geteuid() != 0:
        raise NeedsRoot(
            f"the test cluster listens on {cluster.api}, an address of its own on loopback, which only "
            "root may add: run the tests as root (`make test`), or in a network namespace of their own "
            "(`tools/own-network.sh .venv/bin/python -m pytest ...`, as `make test-fast` does)"
        )
    run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])  # between the nodes' links
    # Whole addresses: 198.18.250.2 is not there because 198.18.250.20 is.
    if f"{cluster.api}/32" not in run(["ip", "-o", "addr", "show", "dev", "lo"]).stdout.split():
        run(["ip", "addr", "add", f"{cluster.api}/32", "dev", "lo"])


def remove_cluster_address(cluster: ClusterAddresses) -> None:
    run(["ip", "addr", "del", f"{cluster.api}/32", "dev", "lo"], check=False)
