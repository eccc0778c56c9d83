"""Adaptive batching benchmark: `latency_objective_s` against fixed batch windows.

    python -m batchd.bench.adaptive                   # both models, 3 interleaved repeats
    python -m batchd.bench.adaptive --quick           # smoke-sized: cost-curve handler, one repeat
    python -m batchd.bench.adaptive --models costcurve --repeats 2

For each model, five real replicas (`batchd serve`, one process each, `max_batch_size` 32, one
batch at a time) take turns under the same loads:
- four with a fixed window (`batch_wait_timeout_s` 0, 2, 10 and 50 ms, no objective);
- one adaptive (`latency_objective_s`), its objective `objective_factor` (2) times the time of a
  full batch at the measured capacity: near capacity an item may wait for a full batch already in
  the model and then ride in its own, so that is the tightest objective every rate up to capacity
  can keep; it is derived in the run, not chosen per result.
Models: `costcurve`, a handler whose every batch of n items takes exactly 20 ms + 1 ms x n
(`batchd.bench.kit.handlers:CostCurve`; 32 / 52 ms = 615 items/s at most), one batch at a time;
`costcurve-shared`, the same curve with two batch slots (`max_concurrent_batches: 2`) that take
turns on one device, as two batches on one GPU do: there a batch sent beside a running one only
queues for the device and a small one wastes it, which is where a window pays under load; and
MiniLM-L6 embeddings on the CPU (the bundled model, as in the main benchmark), one at a time.

Capacity is measured first, in the same run: a closed loop of 64 clients against the 0 ms
window (full batches back to back), the best of three (a neighbour's burst of CPU on this shared
machine can only lower a run). The loads are open loops at 10, 50, 80
and 95% of it, and a bursty one: on/off, `burst_fraction` (120%) of capacity for 2 s, then 2 s
of nothing, four times. Arrivals are Poisson (seeded: every subject of a repeat gets the same
arrival times): evenly spaced arrivals never bunch, which hides what a window is for. Latency
counts from when a request was due (no coordinated omission); each open loop runs
`warmup_s` at its rate before the measured part. Subjects take turns within each repeat (the
order rotates from one repeat to the next) and the report quotes medians over repeats. While
every run goes, the replica's /metrics is sampled: batch sizes, waits, and for the adaptive
replica what it learned and chose (`batchd_batch_cost_*`, `batchd_arrival_rate`,
`batchd_planned_batch_size`, `batchd_objective_*`); the bursty runs keep it as a time series.

The goals, checked per model: at every load, the adaptive replica's p99 within 10%
of the best fixed window's and its throughput within 5% of the best; and on the mix of loads it
beats every fixed window. *The mix*: the five loads weigh the same; a subject's score is the
mean over them of its p99 divided by the best p99 any subject reached at that load (1.0 = best
everywhere); the adaptive replica must score lower than each fixed window.
Results: bench/results/adaptive.{json,md,png}, written after each model; a run of some models
(`--models minilm`) replaces theirs and keeps the others'.
"""

from __future__ import annotations
