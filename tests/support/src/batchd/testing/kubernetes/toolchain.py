"""Where the real Kubernetes binaries are: built from their Go modules by `tools/build-kubernetes.sh`
into a cache folder outside the checkout (`make kubernetes`), found here by asking the same script."""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from batchd.testing import ROOT

BUILD_SCRIPT = ROOT / "tools" / "build-kubernetes.sh"


def cache_root() -> Path:
    """Where the builds and the nodes' image stores are kept between sessions (as the tools/ scripts
    have it): $BATCHD_CACHE, else ~/.cache/batchd."""
    if os.environ.get("BATCHD_CACHE"):
        return Path(os.environ["BATCHD_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "batchd"


@dataclass(frozen=True)
class Toolchain:
    """The folder holding etcd, the control plane's and the node's binaries, kubectl and helm."""

    bin: Path

    def __getitem__(self, name: str) -> str:
        path = self.bin / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: rebuild with `make kubernetes`")
        return str(path)

    @property
    def kubernetes_version(self) -> str:
        """The version the binaries were built at, as `kubectl version` reports it."""
        return self.bin.parent.name.split("-")[1]


@functools.cache
def toolchain(kubernetes_version: str | None = None) -> Toolchain:
    """The binaries for `kubernetes_version` (default: the pinned one), built first if they are not
    in the cache yet (`make kubernetes` does that outside the tests' time)."""
    env = dict(os.environ)
    if kubernetes_version:
        env["KUBERNETES_VERSION"] = kubernetes_version
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return Toolchain(Path(result.stdout.strip().splitlines()[-1]))
