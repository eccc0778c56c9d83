"""pytest fixtures for the real cluster: one control plane per test session and worker (it takes
seconds to start and holds hundreds of MB), a node joined to it when a test first needs pods, and a
namespace of its own for each test that asks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from batchd.testing.kubernetes.controlplane import ControlPlane, namespace, unique_name
from batchd.testing.kubernetes.dns import start_dns
from batchd.testing.kubernetes.images import build_images, load
from batchd.testing.kubernetes.network import ClusterAddresses, worker_slot
from batchd.testing.kubernetes.node import Node

# What the nodes advertise, so that replica pods asking for a GPU are scheduled as on a GPU node.
GPUS_PER_NODE = 8


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The control plane, with batchd's CRD applied as `kubectl apply -f crds/` applies it.

    The CRD goes in first, as envtest installs CRDs: the garbage collector learns a new kind at its
    next discovery (every 30 s) and until then backs off on what it owns, so a deployment deleted
    in a session's first seconds would keep its children for up to a minute more. (`helm install`
    of the chart then finds the CRD present and leaves it, as it does on a user's cluster.)
    """
    with ControlPlane(tmp_path_factory.mktemp("control-plane"), ClusterAddresses(worker_slot())) as cluster:
        cluster.install_crds()
        yield cluster


@pytest.fixture(scope="session")
def kube_node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node of the control plane, with the cluster's DNS and batchd's images in its containerd."""
    start_dns(control_plane)
    with Node(control_plane, control_plane.addresses.node(0), tmp_path_factory.mktemp("node")) as node:
        load(node, build_images())
        node.advertise_gpus(GPUS_PER_NODE)
        yield node


@pytest.fixture(scope="module")
def module_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A `restricted` namespace the tests of one module share (for dry runs and reads)."""
    with namespace(control_plane, unique_name("m")) as name:
        yield name


@pytest.fixture
def kube_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A namespace for this test whose pods must pass the `restricted` Pod Security Standard."""
    with namespace(control_plane, unique_name("t")) as name:
        yield name
