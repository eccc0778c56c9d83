"""BatchedDeployment manifests, written one way: as a user would `kubectl apply` them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchd.api.manifest import document

# The example adder (examples/adder.py), imported from the checkout (a replica's working directory).
ADDER = "examples.adder:BatchAdder.handle_batch"


def manifest(
    name: str,
    model: str | Mapping[str, Any] = ADDER,
    *,
    batching: Mapping[str, Any] | None = None,
    namespace: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A manifest as a user would `kubectl apply` it. `model` is a handler's import path or a
    whole `model` block; every other spec field comes as a keyword (num_replicas=2, env=[...])."""
    model_block = {"handler": model} if isinstance(model, str) else dict(model)
    full_spec: dict[str, Any] = {"model": model_block, **spec}
    if batching is not None:
        full_spec["batching"] = dict(batching)
    return document(name, full_spec, namespace=namespace)
