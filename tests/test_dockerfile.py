"""The Dockerfile: linted by hadolint, and in step with what the operator and the chart expect.

No Docker engine runs here, so the images are not built; the wheel both targets install is.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from batchd.operator import children

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


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


@pytest.mark.parametrize("target", ["operator", "replica"])
def test_each_target_runs_as_the_non_root_user_the_pods_expect(target: str) -> None:
    text = stage(target)
    assert f"USER {children.REPLICA_UID}:{children.REPLICA_UID}" in text
    assert f"[{target}]" in text  # installs its own extra
    assert "org.opencontainers.image.title" in text


def test_the_operator_image_carries_no_torch() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not [dep for dep in extras["operator"] if re.match(r"(torch|transformers)\b", dep)]
    assert not re.search(r"pip install[^\n]*torch", stage("operator"))


def test_the_replica_image_runs_what_the_operator_asks_of_it() -> None:
    text = stage("replica")
    config_path = f"{children.CONFIG_DIR}/{children.CONFIG_KEY}"
    assert 'ENTRYPOINT ["batchd"]' in text and config_path in text
    assert "TORCH_INDEX_URL" in text  # the CPU-only variant
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["batchd"] == "batchd.replica.cli:main"


def test_the_wheel_both_targets_install_builds_with_the_name_they_use(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    wheel = tmp_path / f"batchd-{version}-py3-none-any.whl"
    assert wheel.exists(), list(tmp_path.iterdir())
    assert "/wheels/batchd-${VERSION}-py3-none-any.whl" in DOCKERFILE and f"VERSION={version}" in DOCKERFILE
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("batchd/api/spec.py", "batchd/replica/cli.py", "batchd/operator/handlers.py"):
        assert module in names
