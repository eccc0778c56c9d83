"""The nodes' one image store: a node's copy shares the immutable parts (blobs, unpacked layers) and
owns what containerd writes; a copy whose session died is removed, a live one kept; and on the real
cluster two nodes hold the replica image's files once."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from batchd.testing.kubernetes import image_store
from batchd.testing.kubernetes.node import Node
from batchd.testing.waiting import eventually

BLOB = Path("io.containerd.content.v1.content/blobs/sha256/ab12")
LAYER_FILE = Path("io.containerd.snapshotter.v1.overlayfs/snapshots/7/fs/usr/lib/libtorch.so")
DATABASES = (
    Path("io.containerd.metadata.v1.bolt/meta.db"),
    Path("io.containerd.snapshotter.v1.overlayfs/metadata.db"),
)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store laid out as containerd lays out its root, in a cache folder of the test's own."""
    monkeypatch.setenv("BATCHD_CACHE", str(tmp_path / "cache"))
    root = image_store.store_root()
    for path in (BLOB, LAYER_FILE, *DATABASES):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(f"the store's {path.name}")
    (root / LAYER_FILE.parent / "libtorch.so.2").symlink_to("libtorch.so")
    return root


def test_a_node_copy_links_the_blobs_and_layers_and_owns_its_databases(store: Path) -> None:
    with image_store.node_copy("kube-0-0") as copy:
        for shared in (BLOB, LAYER_FILE):
            assert (copy / shared).stat().st_ino == (store / shared).stat().st_ino, shared
        assert (copy / LAYER_FILE.parent / "libtorch.so.2").readlink() == Path("libtorch.so")
        for database in DATABASES:
            assert (copy / database).stat().st_ino != (store / database).stat().st_ino, database
            (copy / database).write_text("the node's own")
            assert (store / database).read_text() == f"the store's {database.name}"
    eventually(
        lambda: not copy.exists() and not copy.with_name(f"{copy.name}.lock").exists(),
        timeout_s=10,
        what="the node's copy removed once the node is done",
    )
    assert (store / LAYER_FILE).read_text() == "the store's libtorch.so"


def test_a_copy_no_session_holds_is_removed_and_a_held_one_kept(store: Path) -> None:
    with image_store.node_copy("held") as held:
        abandoned = held.with_name("killed-1234abcd")
        image_store._copy(store, abandoned)
        abandoned.with_name(f"{abandoned.name}.lock").touch()  # its holder is gone
        with image_store.node_copy("next") as after:
            assert after.exists() and held.exists()
            assert not abandoned.exists(), "a killed run's copy is not left on the disk"


def test_the_stores_nodes_kept_of_their_own_go_unless_a_containerd_runs_on_one(store: Path) -> None:
    folder = image_store.containerd_folder()
    idle, running = folder / "batchd-0-0", folder / "batchd-1-0"
    for old in (idle, running):
        (old / DATABASES[0]).parent.mkdir(parents=True)
        (old / DATABASES[0]).write_text("bolt")
    with (running / DATABASES[0]).open("a") as database:
        fcntl.flock(database, fcntl.LOCK_EX)  # as bolt holds it while containerd runs
        image_store._remove_per_node_stores()
    assert not idle.exists()
    assert (running / DATABASES[0]).read_text() == "bolt", "a store in use is neither removed nor written"


@pytest.mark.slow
def test_two_nodes_hold_the_replica_image_on_disk_once(kube_node: Node, second_kube_node: Node) -> None:
    blobs = Path("io.containerd.content.v1.content/blobs/sha256")
    largest = max((kube_node.containerd_root / blobs).iterdir(), key=lambda blob: blob.stat().st_size)
    assert largest.stat().st_size > 1_000_000_000, "the replica's torch layer"
    ours, theirs = largest.stat(), (second_kube_node.containerd_root / blobs / largest.name).stat()
    assert (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino)
    assert ours.st_nlink >= 3, "the store's file, linked by both nodes"
    assert os.path.samefile(kube_node.containerd_root.parent, second_kube_node.containerd_root.parent)
