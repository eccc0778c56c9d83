"""The one image store of this machine's test nodes: a containerd root in the cache folder holding
every image they run, imported from `tools/build-images.sh`'s archives and unpacked once.

Each node runs its containerd on a copy of it made of hard links. The shared parts are the ones
containerd never writes once they are complete: the content blobs and the unpacked layers of
committed snapshots. Everything it writes (its databases, the snapshots of the node's own
containers) is the node's own. So the replica's GBs are on disk once however many nodes run, and
a node holds every image the moment it starts: nothing is imported per node, as nothing is pulled
per node of a cluster whose image is already in its nodes' cache.

A registry would be the other way to give the nodes one source. It would add a listener to this
machine, and each node would still unpack its own copy of every layer (the replica's alone is
5.4 GB unpacked), so the disk grows by that much per node.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from subprocess import DEVNULL
from typing import TextIO

import tomli_w

from batchd.testing.kubernetes.images import Image, load
from batchd.testing.kubernetes.processes import Process, run
from batchd.testing.kubernetes.toolchain import cache_root

# The parts of a containerd root that are immutable once written (a blob is named by its digest;
# a committed snapshot's files are only ever a lower layer of an overlay mount).
SHARED_PARTS = (
    Path("io.containerd.content.v1.content/blobs"),
    Path("io.containerd.snapshotter.v1.overlayfs/snapshots"),
)
START_TIMEOUT_S = 60.0


def containerd_folder() -> Path:
    return cache_root() / "containerd"


def store_root() -> Path:
    return containerd_folder() / "images"


def ctr(
    socket: Path, *args: str, check: bool = True, timeout_s: float | None = 120.0
) -> subprocess.CompletedProcess[str]:
    """containerd's own client, on the namespace the kubelet's containers and images live in."""
    return run(["ctr", f"--address={socket}", "--namespace=k8s.io", *args], check=check, timeout_s=timeout_s)


@contextlib.contextmanager
def _locked(shared: bool) -> Iterator[None]:
    """The store's lock: nodes copy it under a shared hold, an import holds it alone."""
    folder = containerd_folder()
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".images.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _serving(root: Path) -> Iterator[Path]:
    """A containerd on `root` (no CRI: it only imports), its socket yielded, stopped after."""
    with tempfile.TemporaryDirectory(prefix="batchd-images-") as scratch:
        directory = Path(scratch)
        socket = directory / "containerd.sock"
        config = {
            "version": 2,
            "root": str(root),
            "state": str(directory / "state"),
            "grpc": {"address": str(socket)},
            "ttrpc": {"address": f"{socket}.ttrpc"},
            "disabled_plugins": ["io.containerd.grpc.v1.cri"],
        }
        (directory / "containerd.toml").write_text(tomli_w.dumps(config))
        process = Process.start(
            "containerd", ["containerd", "--config", str(directory / "containerd.toml")], directory / "log"
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while run(["ctr", f"--address={socket}", "version"], check=False).returncode != 0:
                if process.popen.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"containerd on {root} did not serve:\n{process.tail()}")
                time.sleep(0.1)
            yield socket
        finally:
            process.stop()


def update(images: list[Image]) -> list[Image]:
    """Import into the store each image it does not hold from this archive; return those imported.
    A store that holds them all starts no containerd."""
    with _locked(shared=False):
        _remove_per_node_stores()
        root = store_root()
        record = root / "batchd-archives.json"  # what each name was last imported from
        held: dict[str, str] = json.loads(record.read_text()) if record.exists() else {}
        if all(held.get(image.ref) == str(image.archive) for image in images):
            return []
        root.mkdir(parents=True, exist_ok=True)
        with _serving(root) as socket:
            imported = load(functools.partial(ctr, socket), images)
        record.write_text(json.dumps({**held, **{image.ref: str(image.archive) for image in images}}))
        return imported


def _copy(source: Path, destination: Path) -> None:
    """`source`'s tree at `destination`: the shared parts as hard links, the rest as copies."""
    for directory, folders, files in os.walk(source):
        relative = Path(directory).relative_to(source)
        if relative in SHARED_PARTS:
            shutil.copytree(directory, destination / relative, copy_function=os.link, symlinks=True)
            folders.clear()
            continue
        (destination / relative).mkdir(parents=True)
        shutil.copystat(directory, destination / relative)
        for name in files:
            shutil.copy2(Path(directory) / name, destination / relative / name, follow_symlinks=False)


@contextlib.contextmanager
def node_copy(name: str) -> Iterator[Path]:
    """A containerd root for node `name` holding every image of the store, the node's alone until
    the block ends, then removed. (It lies beside the store: hard links stay on one filesystem.)"""
    copies = containerd_folder() / "nodes"
    copies.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_copies(copies)
    path = copies / f"{name}-{uuid.uuid4().hex[:8]}"
    lock = path.with_name(f"{path.name}.lock")
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            with _locked(shared=True):
                if store_root().exists():
                    _copy(store_root(), path)
                else:
                    path.mkdir()
            yield path
        finally:
            # Unlinking a copy's tens of thousands of entries takes seconds (15 on a busy disk) that
            # no test should wait for: a process of its own does it, holding the copy's lock from
            # the moment this one lets it go, so that no other run removes it as abandoned too.
            # (`setsid --fork`: it outlives this process, and nobody waits for it.)
            remove = ["flock", str(lock), "sh", "-c", 'rm -rf "$0" && rm -f "$1"', str(path), str(lock)]
            subprocess.run(
                ["setsid", "--fork", *remove], stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL, check=True
            )


def _try_lock(path: Path) -> TextIO | None:
    handle = path.open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _remove_abandoned_copies(copies: Path) -> None:
    """The copies of nodes whose session ended without removing them (a killed run): no process
    holds their lock."""
    for lock in copies.glob("*.lock"):
        held = _try_lock(lock)
        if held is None:
            continue
        with held:
            shutil.rmtree(lock.with_suffix(""), ignore_errors=True)
            lock.unlink(missing_ok=True)


def _remove_per_node_stores() -> None:
    """The stores a node kept of its own before this one (`containerd/batchd-<slot>-<index>`), 8 GB
    each, unless a containerd still runs on one (it holds its database's lock)."""
    for old in containerd_folder().glob("batchd-*"):
        database = old / "io.containerd.metadata.v1.bolt" / "meta.db"
        in_use = _try_lock(database) if database.exists() else None
        if database.exists() and in_use is None:
            continue
        shutil.rmtree(old, ignore_errors=True)
        if in_use is not None:
            in_use.close()
