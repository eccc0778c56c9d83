"""pytest fixtures for the real control plane: one per test session and worker (it takes seconds to
start and holds hundreds of MB), and a namespace of its own for each test or module that asks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from batchd.api.crd import CRD_NAME, CRD_PATH
from batchd.testing import ROOT
from batchd.testing.kubernetes.controlplane import ControlPlane, namespace

CRDS = ROOT / CRD_PATH


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The control plane, with batchd's CRD applied as `kubectl apply -f crds/` applies it.

    The CRD goes in first, as envtest installs CRDs: the garbage collector learns a new kind at its
    next discovery (every 30 s) and until then backs off on what it owns, so a deployment deleted
    in a session's first seconds would keep its children for up to a minute more. (`helm install`
    of the chart then finds the CRD present and leaves it, as it does on a user's cluster.)
    """
    with ControlPlane(tmp_path_factory.mktemp("control-plane")) as cluster:
        cluster.kubectl("apply", "--server-side", "-f", str(CRDS))
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
        yield cluster


def unique_name(prefix: str) -> str:
    """A name no other test of the session uses (namespaces are deleted without waiting)."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def kube_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A namespace for this test whose pods must pass the `restricted` Pod Security Standard."""
    with namespace(control_plane, unique_name("t")) as name:
        yield name
