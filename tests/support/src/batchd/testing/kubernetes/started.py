"""A control plane with batchd's CRD, and a node with batchd's images: as the suite's fixtures
start them (one per worker), and as a benchmark starts its own (on a slot no test worker takes)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from batchd.testing.kubernetes import image_store
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.dns import start_dns
from batchd.testing.kubernetes.images import build_images
from batchd.testing.kubernetes.network import ClusterAddresses, benchmark_slot
from batchd.testing.kubernetes.node import Node

# What the nodes advertise, so that replica pods asking for a GPU are scheduled as on a GPU node.
GPUS_PER_NODE = 8


@contextlib.contextmanager
def control_plane_with_crds(directory: Path, addresses: ClusterAddresses) -> Iterator[ControlPlane]:
    """The control plane, with batchd's CRD applied as `kubectl apply -f crds/` applies it.

    The CRD goes in first, as envtest installs CRDs: the garbage collector learns a new kind at its
    next discovery (every 30 s) and until then backs off on what it owns, so a deployment deleted
    in a session's first seconds would keep its children for up to a minute more. (`helm install`
    of the chart then finds the CRD present and leaves it, as it does on a user's cluster.)
    """
    with ControlPlane(directory, addresses) as cluster:
        cluster.install_crds()
        yield cluster


@contextlib.contextmanager
def node_with_images(cluster: ControlPlane, directory: Path, index: int = 0) -> Iterator[Node]:
    """Node `index` of the cluster, with batchd's images in its containerd (the first node starts
    the cluster's DNS)."""
    if index == 0:
        start_dns(cluster)
    image_store.update(build_images())
    with Node(cluster, cluster.addresses.node(index), directory) as node:
        node.advertise_gpus(GPUS_PER_NODE)
        yield node


def benchmark_control_plane(directory: Path) -> contextlib.AbstractContextManager[ControlPlane]:
    """A control plane of a benchmark's own, with batchd's CRD, on a slot no test worker uses."""
    return control_plane_with_crds(directory, ClusterAddresses(benchmark_slot()))


@dataclass(frozen=True)
class Cluster:
    """Where a benchmark's subjects run: a control plane and its node, with batchd's images."""

    control_plane: ControlPlane
    node: Node


@contextlib.contextmanager
def benchmark_cluster(directory: Path) -> Iterator[Cluster]:
    """A benchmark's own cluster (`benchmark_control_plane`) and its node, in `directory`."""
    with (
        benchmark_control_plane(directory / "control-plane") as control_plane,
        node_with_images(control_plane, directory / "node") as node,
    ):
        yield Cluster(control_plane, node)
