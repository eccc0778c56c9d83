"""A BatchedDeployment's revision: what decides the answers its replicas give.

A change to `spec.model` (the model, its handler, init_kwargs, device, dtype, ...) or to the
replica image (`spec.image`, or the operator's default) makes a new revision, which
`spec.rollout` brings to the replicas; a change to anything else (batching, scale, autoscaling)
is retuned live and keeps the revision. The operator labels each replica pod with its revision,
so that the router can tell the revisions of one deployment apart.
"""

from __future__ import annotations

import hashlib
import json

from batchd.api.spec import BatchedDeploymentSpec

REVISION_LENGTH = 10
# Kubernetes' own alphabet for hashes in names and labels (pod-template-hash): no vowels, so no
# words, and no 0, 1 or 3, so never a number (`0e12` is one to a YAML parser) nor a look-alike.
SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# On a replica pod: the revision it serves (the router splits a canary's traffic by it).
REVISION_LABEL = "serving.batchd.dev/revision"


def revision_of(spec: BatchedDeploymentSpec, image: str) -> str:
    """The revision of `spec` run from `image` (its own, or the operator's default): a hash of
    its model block and the image."""
    decides = {"model": spec.model.model_dump(mode="json", by_alias=True, exclude_none=True), "image": image}
    canonical = json.dumps(decides, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).digest()
    return "".join(SAFE_ALPHABET[byte % len(SAFE_ALPHABET)] for byte in digest[:REVISION_LENGTH])
