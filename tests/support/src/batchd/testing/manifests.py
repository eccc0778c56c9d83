"""BatchedDeployment manifests for tests, benchmarks and the demo, written one way: as a user would
`kubectl apply` them."""

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


def doubler(name: str, batch_wait_timeout_s: float) -> dict[str, Any]:
    """A callee for composition: doubles each number, batches of up to 16, and fails any batch
    that holds a negative number (`batch_handlers.Failing`)."""
    return manifest(
        name,
        "batchd.testing.batch_handlers:Failing.handle",
        batching={"max_batch_size": 16, "batch_wait_timeout_s": batch_wait_timeout_s},
    )


def tight(batch_s: float, name: str = "tight") -> dict[str, Any]:
    """A slow adder with room for one item in its model and one in its queue, each batch `batch_s`
    long: two requests fill it, and it refuses a third (503, queue full)."""
    return manifest(
        name,
        {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": batch_s}},
        batching={"max_batch_size": 1, "max_queued_requests": 1, "batch_wait_timeout_s": 0},
    )


def revision(version: int, *, fail_percent: int = 0, delay_s: float = 0.01) -> dict[str, Any]:
    """A model block for one revision of an adder (`batch_handlers.Revision`): each version is a
    new revision, which fails `fail_percent` of its items and holds each batch `delay_s`."""
    init = {"version": version, "fail_percent": fail_percent, "delay_s": delay_s}
    return {"handler": "batchd.testing.batch_handlers:Revision", "init_kwargs": init}
