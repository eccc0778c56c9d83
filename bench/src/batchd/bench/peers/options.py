"""How long, how often and on which cores: the defaults, the smoke-sized run, and the goals."""

from __future__ import annotations

import os
from dataclasses import dataclass

from batchd.bench.peers.catalog import DEFAULT_PEERS, MODELS


@dataclass(frozen=True)
class Options:
    peers: tuple[str, ...] = DEFAULT_PEERS
    models: tuple[str, ...] = tuple(MODELS)
    repeats: int = 3
    duration_s: float = 10.0  # each measured closed loop
    warmup_s: float = 2.0  # the same load first, not counted (connections, caches, JIT-less warm-up)
    ceiling_s: float = 5.0  # the model alone, each repeat
    # Where the models run: `cuda` on a GPU machine (float16 there, as batchd's `dtype: auto`).
    device: str = "cpu"
    # From start to the first answer: a Ray cluster or a MiniLM worker takes tens of seconds on
    # a busy machine; a server that is not answering by then is reported as not starting.
    ready_timeout_s: float = 240.0
    baseline_src: str | None = None  # the replica source tree the `baseline` peer runs from


QUICK = Options(repeats=1, duration_s=1.0, warmup_s=0.3, ceiling_s=0.5, ready_timeout_s=120.0)

# The goals (ratios in one run), checked and reported; a run that misses one still writes its
# figures. The trivial adder: batchd's CPU per request, throughput and p99 at least Mosec's.
# MiniLM: batchd's throughput at least every peer's and this share of the model's own ceiling.
CEILING_GOAL = 0.95


def placement() -> tuple[set[int] | None, set[int] | None]:
    """(the servers' cores, the load generator's): on two or more cores, every server process on
    the first and the load on the others, so that neither takes the other's time; else none."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return None, None
    return {available[0]}, set(available[1:])
