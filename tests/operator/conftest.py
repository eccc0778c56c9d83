"""The operator as the chart runs it, for the tests of this folder that need one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.operated import Namespace, Operator, running_operator


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    with running_operator(control_plane, tmp_path_factory.mktemp("operator")) as running:
        yield running


@pytest.fixture
def ns(control_plane: ControlPlane, kube_namespace: str) -> Iterator[Namespace]:
    with control_plane.client() as api:
        yield Namespace(control_plane, kube_namespace, api)
