"""A BatchedDeployment's revision: what decides the answers its replicas give.

A change to `spec.model` (the model, its handler, init_kwargs, device, dtype, ...) or to
`spec.image` makes a new revision, which `spec.rollout` brings to the replicas; a change to
anything else (batching, scale, autoscaling) is retuned live and keeps the revision. The revision
is a short hash, so the operator and the router name the same one from the same spec.
"""

from __future__ import annotations

import hashlib
import json

from batchd.api.spec import BatchedDeploymentSpec

REVISION_LENGTH = 10


def revision_of(spec: BatchedDeploymentSpec) -> str:
    """The revision of `spec`: a hash of its model block and image, as the API server stores them."""
    decides = {
        "model": spec.model.model_dump(mode="json", by_alias=True, exclude_none=True),
        "image": spec.image,
    }
    canonical = json.dumps(decides, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:REVISION_LENGTH]
