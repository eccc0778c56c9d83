"""Live retuning: a changed `spec.batching` reaches the running batcher, with no restart.

In a pod the manifest is a ConfigMap volume, and the kubelet swaps a changed ConfigMap into the
mounted directory (atomically, within its sync period: about a minute by default). The replica
reads the file every `config_poll_s` and, when only `spec.batching` changed, batches by the new
settings from the next batch on. Nothing listens for this: whoever may edit the resource already
decides what the replicas run, and nobody else on the pod network can change a replica.

Any other change (the model, the image, resources) needs a new pod, and the operator rolls the
pods for it: the replica counts it and leaves it alone. An invalid file changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from batchd.api.manifest import ManifestError, load_manifest
from batchd.api.spec import LIVE_FIELDS, BatchedDeployment, BatchingSpec
from batchd.replica.replica import Replica

logger = logging.getLogger(__name__)


class NeedsRestart(ValueError):
    """The manifest changed in a way only a new replica can serve."""


def batching_change(current: BatchedDeployment, new: BatchedDeployment) -> BatchingSpec | None:
    """The new batching when only the live fields (or the batching revision) changed; None when
    nothing did."""
    kept = {name: getattr(current.spec, name) for name in LIVE_FIELDS}
    if new.spec.model_copy(update=kept) != current.spec or new.metadata.name != current.metadata.name:
        raise NeedsRestart(
            "the model or the pod changed, not only spec.batching or spec.access: a new replica serves that"
        )
    unchanged = all(getattr(new.spec, name) == value for name, value in kept.items())
    if unchanged and new.batching_revision == current.batching_revision:
        return None
    return new.spec.batching


def apply_manifest(replica: Replica, path: Path) -> str:
    """Read the manifest at `path` and retune `replica` by it; the outcome, as the metric counts it."""
    try:
        new = load_manifest(path)
        batching = batching_change(replica.manifest, new)
    except ManifestError as error:
        logger.error(
            "ignoring the changed manifest, which is invalid (the replica keeps running as is): %s", error
        )
        return "invalid"
    except NeedsRestart as error:
        logger.warning("%s: %s", path, error)
        return "needs_restart"
    if batching is not None:
        replica.retune(new)
        logger.info(
            "manifest applied live (batching revision %d): %s", new.batching_revision, batching.model_dump()
        )
    return "applied"


async def watch_manifest(replica: Replica, path: Path, interval_s: float) -> None:
    """Poll the manifest file and apply each change (a stat and a small read per interval).

    Polling rather than inotify: the kubelet's atomic symlink swap replaces the directory the
    file lives in, which inotify watches on the file would miss.
    """
    last = _read(path)
    while True:
        await asyncio.sleep(interval_s)
        content = _read(path)
        if content is None or content == last:
            continue
        last = content
        replica.metrics.reloaded(apply_manifest(replica, path))


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError as error:  # mid-swap, or the volume went away: try again next time
        logger.debug("cannot read %s: %s", path, error)
        return None
