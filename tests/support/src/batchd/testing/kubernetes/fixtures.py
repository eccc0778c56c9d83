"""pytest fixtures for the real cluster: one control plane per test session and worker (it takes
seconds to start and holds hundreds of MB), a node joined to it when a test first needs pods, and a
namespace of its own for each test that asks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from batchd.testing.kubernetes.controlplane import ControlPlane, namespace, unique_name
from batchd.testing.kubernetes.network import ClusterAddresses, worker_slot
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.started import control_plane_with_crds, node_with_images


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The control plane, with batchd's CRD."""
    with control_plane_with_crds(
        tmp_path_factory.mktemp("control-plane"), ClusterAddresses(worker_slot())
    ) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kube_node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node of the control plane, with the cluster's DNS and batchd's images in its containerd."""
    with node_with_images(control_plane, tmp_path_factory.mktemp("node")) as node:
        yield node


@pytest.fixture
def second_kube_node(kube_node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A second node, for a test that needs a spread or a drain; for that test alone, as the other
    tests of the session's cluster count on one node. (Its folder is not the test's: the kubelet's
    sockets below it must stay within a socket path's 108 bytes.)"""
    with node_with_images(kube_node.cluster, tmp_path_factory.mktemp("node"), index=1) as node:
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
