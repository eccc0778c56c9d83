"""batchd's images for the nodes: built from the project's Dockerfile by `tools/build-images.sh`
(cached by their inputs), and imported into a containerd (the nodes' shared store, `image_store`)
only when it lacks that image."""

from __future__ import annotations

import json
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from batchd.testing import ROOT

BUILD_SCRIPT = ROOT / "tools" / "build-images.sh"
# The replica image is GBs: about 100 s to import on two idle cores, several times that on busy ones.
IMPORT_TIMEOUT_S = 900.0

Ctr = Callable[..., subprocess.CompletedProcess[str]]  # containerd's client on one containerd


@dataclass(frozen=True)
class Image:
    target: str
    archive: Path
    ref: str


def build_images(*targets: str) -> list[Image]:
    """The images of these Dockerfile targets (and `pause`), built if their inputs changed."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), *targets], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    images = []
    for line in result.stdout.splitlines():
        target, archive, ref = line.split()
        images.append(Image(target, Path(archive), ref))
    return images


def manifest_digest(archive: Path) -> str:
    """The digest of the image an OCI archive holds: what containerd names it by once imported."""
    with tarfile.open(archive) as tar:
        index = tar.extractfile("index.json")
        assert index is not None, f"{archive} has no index.json"
        digest: str = json.load(index)["manifests"][0]["digest"]
        return digest


def load(ctr: Ctr, images: list[Image]) -> list[Image]:
    """Import into a containerd each image it does not hold at this digest; return those imported."""
    imported = []
    for image in images:
        if manifest_digest(image.archive) in ctr("images", "list", f"name=={image.ref}").stdout:
            continue
        ctr("images", "import", str(image.archive), timeout_s=IMPORT_TIMEOUT_S)
        imported.append(image)
    if imported:
        remove_superseded(ctr)
    return imported


def remove_superseded(ctr: Ctr) -> None:
    """Drop the images no name points to any more: an import moves a name to the new image, but the
    CRI plugin's `sha256:<id>` reference keeps the old one, and the replica's GBs would fill the disk
    within a few rebuilds. The kubelet's own image GC works by percentage of a disk far larger than
    what is free to us, so it is off (see `node.py`)."""
    rows = [line.split() for line in ctr("images", "list").stdout.splitlines()[1:]]
    named = {row[2] for row in rows if not row[0].startswith("sha256:")}
    superseded = [row[0] for row in rows if row[0].startswith("sha256:") and row[2] not in named]
    if superseded:
        ctr("images", "rm", "--sync", *superseded, timeout_s=None)
