"""Autoscaling benchmark: what a load step does to an autoscaled BatchedDeployment and to a fixed one.

    python -m batchd.bench.autoscaling                 # the load step, 3 interleaved repeats
    python -m batchd.bench.autoscaling --quick         # smoke-sized: short phases, one repeat

Why it exists: the autoscaling tests say that replicas come and go; this says how fast, and what
a user's requests see meanwhile. In the same run, taking turns, two subjects get the same load
step (low, then about 4x one replica's capacity, then low again), each in a fresh release of the
chart on the test cluster (`batchd.testing.kubernetes`: a real control plane and node, replicas
as pods of batchd's image, the load through the subject's Service and kube-proxy) with the real
operator (`python -m batchd.operator`, its own process, on the chart's ServiceAccount):
- `autoscaled`: autoscaling from 1 to 6 replicas with short stabilization windows;
- `fixed`: one replica, no autoscaling.
The handler holds every batch for a fixed time whatever its size (`SlowAdder`, a GPU's fixed
cost per batch), so a replica's capacity is max_batch_size / batch time whatever this machine's
CPU does, and 4x that is only a few hundred small HTTP requests a second: the two shared cores
carry the HTTP work of the load, the replicas and the operator with room to spare.

Every `sample_s` it records the offered rate, the Deployment's desired replicas, the ready
replicas and the total queue (the sum of every ready replica's `GET /load` queued_items); the
windowed p99 comes from the traffic's outcomes afterwards. Figures per subject (medians over
repeats) and one chart (`autoscaling.png`) go to bench/results/. A request that gets no usable
answer (not a 2xx, nor a 503 with Retry-After) fails the run loudly.
"""

from __future__ import annotations
