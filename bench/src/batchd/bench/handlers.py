"""Batch handlers for the benchmarks, named by import path in the manifests the harness writes.

`TrivialAdder` is the seeds' vectorised adder (examples/adder.py) without its 200 ms sleep and
its print: a handler that costs next to nothing, so what a run measures is the server itself.
"""

from __future__ import annotations


class TrivialAdder:
    async def handle_batch(self, numbers: list[int]) -> list[int]:
        return [n + 1 for n in numbers]
