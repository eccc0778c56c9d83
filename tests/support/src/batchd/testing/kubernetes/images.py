"""batchd's images for the nodes: built from the project's Dockerfile by `tools/build-images.sh`
(cached by their inputs), and imported into a node's containerd only when it lacks that build."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from batchd.testing import ROOT
from batchd.testing.kubernetes.node import Node

BUILD_SCRIPT = ROOT / "tools" / "build-images.sh"
# Marks an image in containerd with the archive it came from, so a later session knows it is current.
ARCHIVE_LABEL = "dev.batchd.archive"


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


def load(node: Node, images: list[Image]) -> list[Image]:
    """Import into the node's containerd each image it does not hold at this build; return those
    imported."""
    imported = []
    for image in images:
        labels = node.ctr("images", "list", f"name=={image.ref}").stdout
        if f"{ARCHIVE_LABEL}={image.archive.name}" in labels:
            continue
        node.ctr("images", "import", str(image.archive))
        node.ctr("images", "label", image.ref, f"{ARCHIVE_LABEL}={image.archive.name}")
        imported.append(image)
    return imported
