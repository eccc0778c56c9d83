"""Revisions: what decides the answers a deployment's replicas give, and what decides how they batch.

A change to `spec.model` (the model, its handler, init_kwargs, device, dtype, ...) or to the
replica image (`spec.image`, or the operator's default) makes a new revision, which
`spec.rollout` brings to the replicas; a change to anything else keeps the revision (one to the
pods' resources or env still rolls them, as any Deployment does, but is never a canary). The
operator labels each replica pod, and its Deployment's template, with its revision
(`pod.REVISION_LABEL`): the canary's judge counts each revision's answers by it, and the status
tells a rolled-out Deployment by it. The router tells a canary's replicas from the stable ones by
their track (`pod.track_of`), not by revision.

A change to `spec.batching` makes a new batching revision instead, which the operator writes
into the replicas' manifest, and running replicas take live (the replica's `retuning`) and
report in `GET /load`.

Both are hashes of what decides them, never counters: the same spec has the same revisions
whatever edits led to it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from batchd.api.spec import BatchedDeploymentSpec, BatchingSpec

REVISION_LENGTH = 10
# Kubernetes' own alphabet for hashes in names and labels (pod-template-hash): no vowels, so no
# words, and no 0, 1 or 3, so never a number (`0e12` is one to a YAML parser) nor a look-alike.
SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# A batching revision is a number (replicas export it as a gauge), below 2**53 so that JSON
# parsers and Prometheus' float64 samples keep every digit.
BATCHING_REVISION_BITS = 52


def _digest(document: Any) -> bytes:
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).digest()


def revision_of(spec: BatchedDeploymentSpec, image: str) -> str:
    """The revision of `spec` run from `image` (its own, or the operator's default): a hash of
    its model block and the image."""
    model = spec.model.model_dump(mode="json", by_alias=True, exclude_none=True)
    digest = _digest({"model": model, "image": image})
    return "".join(SAFE_ALPHABET[byte % len(SAFE_ALPHABET)] for byte in digest[:REVISION_LENGTH])


def batching_revision_of(batching: BatchingSpec) -> int:
    """The batching revision of `batching`: a hash of it, as a positive number."""
    digest = _digest(batching.model_dump(mode="json", by_alias=True))
    return int.from_bytes(digest[:8], "big") >> (64 - BATCHING_REVISION_BITS) or 1
