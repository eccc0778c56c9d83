"""The Dockerfile: linted by hadolint, and each image installs exactly the projects it needs.

No Docker engine runs here, so the images are not built; the wheels they install are.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from batchd.api.pod import CONFIG_PATH, REPLICA_PORT, ROUTER_PORT, RUNTIME_UID
from batchd.testing import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
# What must never reach the operator image, directly or through the projects it installs.
MODEL_STACK = ("torch", "transformers", "fastapi", "uvicorn")
# What must never reach the router image: it serves a plain ASGI app with uvicorn.
ROUTER_FORBIDDEN = ("torch", "transformers", "fastapi", "kopf")


def stage(name: str) -> str:
    """The text of one build stage, from its FROM line to the next."""
    match = re.search(rf"^FROM \S+ AS {name}\n(.*?)(?=^FROM |\Z)", DOCKERFILE, re.MULTILINE | re.DOTALL)
    assert match, f"no stage named {name}"
    return match.group(1)


def test_hadolint_finds_nothing() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    result = subprocess.run(
        [str(hadolint), "Dockerfile"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


@pytest.mark.parametrize("target", ["operator", "replica", "router"])
def test_each_target_runs_as_the_non_root_user_the_pods_expect(target: str) -> None:
    text = stage(target)
    assert f"USER {RUNTIME_UID}:{RUNTIME_UID}" in text
    assert "org.opencontainers.image.title" in text
    assert f"--uid {RUNTIME_UID} --gid {RUNTIME_UID}" in stage("base")


def test_only_shipped_projects_enter_the_build() -> None:
    copied = re.findall(r"^COPY (\S+) ", stage("build"), re.MULTILINE)
    assert copied == ["VERSION", "api", "operator", "replica", "router"]
    assert "/wheels/batchd_api-*.whl /wheels/batchd_operator-*.whl" in stage("operator")
    assert "/wheels/batchd_api-*.whl /wheels/batchd_replica-*.whl" in stage("replica")
    assert "/wheels/batchd_api-*.whl /wheels/batchd_router-*.whl" in stage("router")
    assert "bench" not in DOCKERFILE.replace("benchmarks", "") and "tests" not in stage("build")


def installed_with(project: str, extras: frozenset[str] = frozenset()) -> set[str]:
    """The names of what installing `project[extras]` brings, through the batchd projects it
    needs and the extras it asks of them (as pip installs an image's wheels)."""
    names: set[str] = set()
    for text in requires(project) or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is not None and not any(marker.evaluate({"extra": extra}) for extra in extras or {""}):
            continue
        names.add(requirement.name)
        if requirement.name.startswith("batchd-"):
            names |= installed_with(requirement.name, frozenset(requirement.extras))
    return names


def test_the_operator_image_carries_no_model_stack() -> None:
    installed = installed_with("batchd-operator")
    assert "kubernetes" in installed  # through batchd-api[kube]
    assert not installed & set(MODEL_STACK), installed


def test_the_router_image_carries_no_model_stack() -> None:
    installed = installed_with("batchd-router")
    assert {"kubernetes", "uvicorn"} <= installed  # through batchd-api[kube,server]
    assert not installed & set(ROUTER_FORBIDDEN), installed


def test_the_api_alone_needs_neither_kubernetes_nor_a_server() -> None:
    assert not installed_with("batchd-api") & {"kubernetes", "uvicorn", *MODEL_STACK}


def test_the_router_image_runs_the_router_on_its_port() -> None:
    text = stage("router")
    assert 'ENTRYPOINT ["batchd-router"]' in text
    assert f"EXPOSE {ROUTER_PORT}" in text


def test_the_replica_image_runs_what_the_operator_asks_of_it() -> None:
    text = stage("replica")
    assert 'ENTRYPOINT ["batchd"]' in text
    assert f'CMD ["serve", "{CONFIG_PATH}", "--host", "0.0.0.0", "--port", "{REPLICA_PORT}"]' in text
    assert f"EXPOSE {REPLICA_PORT}" in text
    assert '--extra-index-url "${TORCH_INDEX_URL}"' in text  # the CPU-only variant


@pytest.mark.slow  # pip fetches the build backend from PyPI, as the image build does
def test_the_wheels_the_images_install_build_and_hold_their_modules(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            "./api",
            "./operator",
            "./replica",
            "./router",
        ],
        cwd=ROOT,
        check=True,
        timeout=300,
        capture_output=True,
    )
    version = (ROOT / "VERSION").read_text().strip()
    expected = {
        f"batchd_api-{version}-py3-none-any.whl": "batchd/api/spec.py",
        f"batchd_operator-{version}-py3-none-any.whl": "batchd/operator/kopf_handlers.py",
        f"batchd_replica-{version}-py3-none-any.whl": "batchd/replica/cli.py",
        f"batchd_router-{version}-py3-none-any.whl": "batchd/router/cli.py",
    }
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(expected)
    for wheel, module in expected.items():
        names = zipfile.ZipFile(tmp_path / wheel).namelist()
        assert module in names
        # A namespace package: no project owns batchd/__init__.py, so they install side by side.
        assert "batchd/__init__.py" not in names
