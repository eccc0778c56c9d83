"""The layout needs no import tricks: plain path entries, no top-level package, no stdlib shadowing."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

from batchd.testing import ROOT

COMPONENTS = ("api", "operator", "replica", "router", "bench", "tests/support")


def test_the_standard_librarys_operator_is_importable_from_the_repository_root() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import operator; operator.add; print(operator.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == Path(sysconfig.get_paths()["stdlib"])


def test_no_top_level_folder_is_a_package() -> None:
    assert not [path for path in ROOT.glob("*/__init__.py") if path.parent.name != "examples"]


def test_editable_installs_are_plain_path_entries() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    entries = {line.strip() for pth in site.glob("*.pth") for line in pth.read_text().splitlines()}
    for component in COMPONENTS:
        assert str(ROOT / component / "src") in entries, component
    assert not [entry for entry in entries if entry.startswith("import") and "editable" in entry]


def test_mypy_checks_every_folder_of_tests() -> None:
    files = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"])
    folders = {f"tests/{path.name}" for path in (ROOT / "tests").iterdir() if path.is_dir()}
    folders -= {"tests/support", "tests/__pycache__"}
    assert folders <= files, sorted(folders - files)
    assert {"tests/*.py", "tests/support/src"} <= files
