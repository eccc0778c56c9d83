"""One source of truth for what the parts share: the version, the replica port, the UID, the
managed-by label, the images and the torch pin. Each lives once in Python (`batchd.api`, a
project's pyproject.toml); the chart and the Dockerfile cannot import it, so this test reads
them and fails when any of them says something else.
"""

from __future__ import annotations

import re
from importlib.metadata import version

import yaml

from batchd.api import __version__
from batchd.api.pod import MANAGED_BY, OPERATOR_IMAGE, REPLICA_IMAGE, REPLICA_PORT, RUNTIME_UID
from batchd.operator.settings import Settings
from batchd.testing import ROOT
from batchd.testing.helm import CHART, only, render

PROJECTS = ("batchd-api", "batchd-operator", "batchd-replica", "batchd-testing", "batchd-bench")


def test_one_version_everywhere() -> None:
    release = (ROOT / "VERSION").read_text().strip()
    assert __version__ == release
    assert {project: version(project) for project in PROJECTS} == dict.fromkeys(PROJECTS, release)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == release
    assert release not in (ROOT / "Dockerfile").read_text()  # passed in as --build-arg VERSION


def test_the_chart_runs_the_images_and_user_the_operator_expects() -> None:
    objects = render({"monitoring": {"enabled": True}})
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert container["image"] == f"{OPERATOR_IMAGE}:{__version__}"
    assert env["BATCHD_REPLICA_IMAGE"] == f"{REPLICA_IMAGE}:{__version__}" == Settings().replica_image
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (RUNTIME_UID,) * 2
    monitor = only(objects, "PodMonitor")["spec"]
    assert MANAGED_BY.items() <= monitor["selector"]["matchLabels"].items()
    assert monitor["podMetricsEndpoints"][0]["port"] == "http"


def test_the_dockerfile_agrees_on_user_and_port() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert set(re.findall(r"--uid (\d+) --gid (\d+)", dockerfile)) == {(str(RUNTIME_UID), str(RUNTIME_UID))}
    assert set(re.findall(r"^USER (\S+)", dockerfile, re.MULTILINE)) == {f"{RUNTIME_UID}:{RUNTIME_UID}"}
    assert f"EXPOSE {REPLICA_PORT}" in dockerfile


def test_torch_is_pinned_once() -> None:
    pins = {
        str(path.relative_to(ROOT)): re.findall(r"torch==[\d.]+", path.read_text())
        for path in [
            *ROOT.glob("*/pyproject.toml"),
            ROOT / "tests/support/pyproject.toml",
            ROOT / "Dockerfile",
        ]
    }
    assert {where: found for where, found in pins.items() if found} == {
        "replica/pyproject.toml": ["torch==2.13.0"]
    }
