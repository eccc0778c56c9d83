"""Each peer's own virtual environment, made from the pinned requirements file in `requirements/`.

A peer never shares batchd's environment: its pins (FastAPI, uvicorn, pydantic, ...) would fight
ours, and `make test` must never install it. The environment lives under a cache folder, named
after the peer and a hash of its requirements and of the interpreter, so that changing a pin
makes a new one and an unchanged file reuses the old one (the first Ray install downloads
hundreds of MB; the next run starts at once).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from batchd.bench.kit import CHECKOUT

REQUIREMENTS_DIR = Path(__file__).resolve().parent / "requirements"
CACHE_DIR = CHECKOUT / "build" / "peers"
# Written last, once pip has finished: an environment without it is a failed or interrupted one.
MARKER = ".installed"
INSTALL_TIMEOUT_S = 1800.0


class InstallFailed(RuntimeError):
    """pip could not make a peer's environment; the message carries the tail of its output."""


def requirements_path(peer: str) -> Path:
    return REQUIREMENTS_DIR / f"{peer}.txt"


def requirements_hash(requirements: str, python: str) -> str:
    """12 hex digits that change with any byte of the requirements or the interpreter's version:
    the environment a file made is reused only for that very file and Python."""
    return hashlib.sha256(f"{python}\n{requirements}".encode()).hexdigest()[:12]


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def venv_dir(peer: str, requirements: str, cache_dir: Path = CACHE_DIR) -> Path:
    """`<cache>/<peer>-<hash>`: where the environment for these requirements lives."""
    return cache_dir / f"{peer}-{requirements_hash(requirements, python_version())}"


@dataclass(frozen=True)
class PeerEnv:
    """A ready environment: its interpreter, and what pip installed (`pip freeze`)."""

    path: Path
    frozen: tuple[str, ...]

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def version_of(self, distribution: str) -> str:
        """The installed version of `distribution` ("?" when pip did not list it)."""
        wanted = distribution.lower().replace("_", "-")
        for line in self.frozen:
            name, _, version = line.partition("==")
            if name.lower().replace("_", "-").split("[")[0] == wanted:
                return version
        return "?"


def ensure(peer: str, cache_dir: Path = CACHE_DIR) -> PeerEnv:
    """The peer's environment, made now if no finished one matches its requirements file (pip's
    output goes to `<cache>/<peer>-install.log`)."""
    requirements = requirements_path(peer).read_text()
    path = venv_dir(peer, requirements, cache_dir)
    marker = path / MARKER
    if not marker.exists():
        _make(path, requirements_path(peer), cache_dir / f"{peer}-install.log")
        frozen = subprocess.run(
            [str(path / "bin" / "python"), "-m", "pip", "freeze"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        marker.write_text(frozen)
    return PeerEnv(path, tuple(marker.read_text().split()))


def _make(path: Path, requirements: Path, log_path: Path) -> None:
    if path.exists():  # an interrupted install: start again from nothing
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", str(path)],
        [str(path / "bin" / "python"), "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [str(path / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(requirements)],
    ]
    with log_path.open("w") as log:
        for step in steps:
            log.write(f"$ {' '.join(step)}\n")
            log.flush()
            done = subprocess.run(step, stdout=log, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S)
            if done.returncode != 0:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
                raise InstallFailed(f"`{' '.join(step[-3:])}` exited {done.returncode}:\n{tail}")
