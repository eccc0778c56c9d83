"""One source of truth for what the parts share: the version, the replica port, the UID, the
managed-by label, the images and the torch pin. Each lives once in Python (`batchd.api`, a
project's pyproject.toml); the chart and the Dockerfile cannot import it, so this test reads
them and fails when any of them says something else.
"""

from __future__ import annotations

import re
from importlib.metadata import version
from typing import Any

import pytest
import yaml

from batchd.api import __version__
from batchd.api.pod import (
    MANAGED_BY,
    OPERATOR_IMAGE,
    REPLICA_IMAGE,
    REPLICA_PORT,
    ROUTER_ADMIN_PORT,
    ROUTER_COMPONENT,
    ROUTER_IMAGE,
    ROUTER_PORT,
    RUNTIME_UID,
)
from batchd.operator.settings import Settings
from batchd.router.settings import RouterSettings
from batchd.testing import ROOT
from batchd.testing.helm import CHART, only, render

PROJECTS = (
    "batchd-api",
    "batchd-operator",
    "batchd-replica",
    "batchd-router",
    "batchd-testing",
    "batchd-bench",
)


def test_one_version_everywhere() -> None:
    release = (ROOT / "VERSION").read_text().strip()
    assert __version__ == release
    assert {project: version(project) for project in PROJECTS} == dict.fromkeys(PROJECTS, release)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == release
    assert release not in (ROOT / "Dockerfile").read_text()  # passed in as --build-arg VERSION


def test_the_chart_runs_the_images_and_user_the_operator_expects() -> None:
    objects = render({"monitoring": {"enabled": True}})
    pod = component(objects, "Deployment", "operator")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert container["image"] == f"{OPERATOR_IMAGE}:{__version__}"
    assert env["BATCHD_REPLICA_IMAGE"] == f"{REPLICA_IMAGE}:{__version__}" == Settings().replica_image
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (RUNTIME_UID,) * 2
    monitor = only(objects, "PodMonitor")["spec"]
    assert MANAGED_BY.items() <= monitor["selector"]["matchLabels"].items()
    assert monitor["podMetricsEndpoints"][0]["port"] == "metrics"


def component(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return only(
        [o for o in objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == name], kind
    )


def test_chart_operator_router_and_dockerfile_agree_on_the_routers_port_image_and_labels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = render({"monitoring": {"enabled": True}})
    router = component(objects, "Deployment", "router")
    pod = router["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["image"] == f"{ROUTER_IMAGE}:{__version__}"
    assert {port["name"]: port["containerPort"] for port in container["ports"]} == {
        "http": ROUTER_PORT,
        "admin": ROUTER_ADMIN_PORT,
    }
    assert ROUTER_COMPONENT.items() <= pod["metadata"]["labels"].items()
    assert RouterSettings().port == ROUTER_PORT
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["BATCHD_PORT"] == str(ROUTER_PORT)
    assert env["BATCHD_ADMIN_PORT"] == str(ROUTER_ADMIN_PORT)
    # The operator finds these very pods, in this namespace, and tells clients this Service.
    operator_env = {
        item["name"]: item["value"]
        for item in component(objects, "Deployment", "operator")["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    for variable, value in operator_env.items():
        monkeypatch.setenv(variable, value)
    settings = Settings.from_env()
    wanted = dict(term.split("=", 1) for term in settings.router_selector.split(","))
    assert wanted.items() <= pod["metadata"]["labels"].items()
    assert ROUTER_COMPONENT.items() <= wanted.items()
    service = component(objects, "Service", "router")
    assert (
        settings.router_url == f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    )
    assert settings.router_namespace == router["metadata"]["namespace"]
    assert service["spec"]["ports"][0] == {
        "name": "http",
        "port": 80,
        "targetPort": "http",
        "protocol": "TCP",
    }
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"EXPOSE {ROUTER_PORT}" in dockerfile.split("AS router", 1)[1]


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
