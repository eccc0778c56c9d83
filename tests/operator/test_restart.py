"""The operator stopped midway and started again, on a real cluster: it picks up what changed while
it was away and creates nothing twice (every create is in the API server's audit log)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from batchd.operator import children
from batchd.testing.kubernetes.components import refused
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.release import Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow


def creates(release: Release, resource: str) -> int:
    return sum(
        1
        for event in release.cluster.audit_events(release.operator_user)
        if event["verb"] == "create"
        and event["stage"] == "ResponseComplete"
        and event.get("objectRef", {}).get("resource") == resource
    )


def test_operator_restarted_midway_makes_no_duplicates(control_plane: ControlPlane, tmp_path: Path) -> None:
    with installed(control_plane, tmp_path) as release:
        ns = release.namespace

        def apply(name: str) -> None:
            control_plane.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest(name)))

        with release.operator(tmp_path / "operator.log"):
            for name in ("one", "two", "three"):
                apply(name)
            eventually(lambda: release.get("deployment", "one"), what="the first Deployment")
        # Stopped in the middle; meanwhile a child goes away and a resource is added.
        control_plane.kubectl("delete", "-n", ns, "service/one")
        apply("four")
        with release.operator(tmp_path / "operator.log"):
            for name in ("one", "two", "three", "four"):
                for kind, child in (
                    ("deployment", name),
                    ("service", name),
                    ("configmap", children.config_map_name(name)),
                ):
                    eventually(
                        lambda kind=kind, child=child: release.get(kind, child), what=f"{kind} {child}"
                    )
                eventually(
                    lambda name=name: (release.get("bd", name) or {}).get("status"), what=f"status of {name}"
                )
        assert creates(release, "deployments") == 4  # each created once, across both runs
        assert creates(release, "services") == 5  # and the one deleted, once more
        assert refused(control_plane, release.operator_user, namespace=ns) == []
