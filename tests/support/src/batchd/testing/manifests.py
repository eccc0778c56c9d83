"""BatchedDeployment manifests for tests, written the one way the benchmarks write them too."""

from typing import Any

from batchd.bench.kit.manifests import ADDER, manifest

__all__ = ["ADDER", "doubler", "manifest", "tight"]


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
