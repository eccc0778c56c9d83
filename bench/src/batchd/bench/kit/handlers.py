"""Batch handlers for the benchmarks, named by import path in the manifests the harness writes.

`TrivialAdder` is the example vectorised adder (examples/adder.py) without its 200 ms sleep and
its print: a handler that costs next to nothing, so what a run measures is the server itself.

`CostCurve` holds every batch of n items for exactly `alpha_s + beta_s * n` seconds: a model with
a known cost curve (the adaptive batching benchmark). It is a sync handler that blocks in
`time.sleep`, on purpose: a blocking call in the replica's model thread is how the real pipelines
run, the sleep is precise to well under a millisecond (asyncio's timers round up to whole
milliseconds, which would bend a 1 ms-per-item slope), and it holds no CPU, so the curve stays
the same on a shared machine whatever the load generator and the neighbours do (as a GPU's
kernel time would, with the CPU free).
"""

from __future__ import annotations

import threading
import time

# How a manifest names the trivial adder's batch method.
TRIVIAL_ADDER = "batchd.bench.kit.handlers:TrivialAdder.handle_batch"


class TrivialAdder:
    async def handle_batch(self, numbers: list[int]) -> list[int]:
        return [n + 1 for n in numbers]


class CostCurve:
    """Adds one to each item, after holding the batch for alpha_s + beta_s * len(batch) seconds;
    with `shared_device`, concurrent batches take turns (one GPU runs one batch's kernels at a
    time), so a batch sent while another runs waits for it first."""

    def __init__(self, alpha_s: float = 0.02, beta_s: float = 0.001, shared_device: bool = False) -> None:
        self.alpha_s = alpha_s
        self.beta_s = beta_s
        self._device = threading.Lock() if shared_device else None

    def __call__(self, numbers: list[int]) -> list[int]:
        if self._device is None:
            time.sleep(self.alpha_s + self.beta_s * len(numbers))
        else:
            with self._device:
                time.sleep(self.alpha_s + self.beta_s * len(numbers))
        return [n + 1 for n in numbers]
