"""Where a model's weights are: `model.source` resolved to something transformers can load.

`hf://org/name` looks in the mirror directory first (`$BATCHD_MODEL_MIRROR/org/name`), for
clusters with no internet; without a mirror copy it stays a hub id, and transformers' own
cache and download rules apply. `pvc://claim/path` is where the operator mounts the claim.
"""

from __future__ import annotations

from pathlib import Path

from batchd.replica.models.base import ModelLoadError


def resolve_source(source: str, *, mirror_dir: Path | None, pvc_root: Path) -> str:
    """A local directory, or a hub id when an `hf://` source has no copy in the mirror."""
    scheme, _, rest = source.partition("://")
    if not rest:
        raise ModelLoadError(f"model.source: expected hf://, pvc:// or file://, got {source!r}")
    if scheme == "file":
        return str(_existing(Path(rest), source))
    if scheme == "pvc":
        claim, _, inside = rest.partition("/")
        if not claim:
            raise ModelLoadError(f"model.source: pvc:// needs a claim name, got {source!r}")
        return str(_existing(pvc_root / claim / inside, source))
    if scheme == "hf":
        if mirror_dir is not None and (mirror_dir / rest).is_dir():
            return str(mirror_dir / rest)
        return rest
    raise ModelLoadError(f"model.source: unknown scheme {scheme!r} in {source!r}")


def _existing(path: Path, source: str) -> Path:
    if not path.exists():
        raise ModelLoadError(f"model.source: {source!r} resolves to {path}, which does not exist")
    return path
