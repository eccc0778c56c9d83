"""A steady load that wobbles does not make the autoscaler flap: the real operator, real replica
processes, real load, for 45 s.

The operator runs against the emulated API server; the stand-in cluster (`batchd.testing.cluster`)
runs a real `batchd serve` for every pod the Deployment asks for, each on its own loopback
address; open-loop traffic goes to the ready endpoints as kube-proxy would send it. (Scaling up
and down and live retuning run on a real cluster: `tests/e2e/test_autoscaling.py`. This one stays
here while its count of turns is not steady beside a CPU hog on a real node, where every replica
start costs the load's client its CPU.)

The handler holds every batch for a fixed time, as a GPU does for a batch of any size up to its
limit, so one replica serves at most max_batch_size / BATCH_S items a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from batchd.testing.apiserver import ApiServer
from batchd.testing.cluster import Cluster, PodView
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import api_server, create, eventually, running_operator
from batchd.testing.traffic import Traffic, unanswered

pytestmark = pytest.mark.slow

NS = "default"
BATCH_S = 0.1  # every batch holds the model this long
MAX_BATCH = 4  # so one replica serves at most 40 items/s
POLL_S = 0.25  # the operator reads every ready replica this often
START_S = 60.0


def slow_adder(name: str, batch_s: float = BATCH_S, **spec: Any) -> dict[str, Any]:
    model = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": batch_s}}
    spec.setdefault("batching", {"max_batch_size": MAX_BATCH, "batch_wait_timeout_s": 0.02})
    return manifest(name, model, **spec)


@contextlib.asynccontextmanager
async def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[ApiServer, Cluster]]:
    # A 1 s preStop: endpoints drop a pod before it stops listening, as in a cluster.
    monkeypatch.setenv("BATCHD_DRAIN_DELAY_S", "1")
    async with (
        api_server(tmp_path) as server,
        running_operator(server, replica_poll_interval_s=POLL_S, autoscaling_status_interval_s=POLL_S),
        Cluster(server, tmp_path / "cluster", config_sync_period_s=0.2) as cluster,
    ):
        yield server, cluster


def cr(server: ApiServer, name: str) -> dict[str, Any]:
    return server.get_object("serving.batchd.dev/batcheddeployments", NS, name) or {}


def ready(cluster: Cluster, name: str) -> list[PodView]:
    return [pod for pod in cluster.pods(name) if pod.ready and not pod.terminating]


def traffic(cluster: Cluster, name: str, rate: float | Any) -> Traffic:
    return Traffic(lambda: cluster.endpoints(name), f"/v1/models/{name}:predict", b'{"instances": [1]}', rate)


async def test_steady_load_does_not_flap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    load_s = 45.0
    # Both windows span a whole cycle of the wobble below (3 s), so the wobble alone moves nothing.
    autoscaling = {"min_replicas": 1, "max_replicas": 6, "upscale_delay_s": 3, "downscale_delay_s": 4}

    # Batches twice as long, so half the requests are one and a half replicas' worth: every request
    # costs CPU (client, replica, stand-in cluster) and a batch only time, and the count must follow
    # the load, not how busy the machine is.
    batch_s = 2 * BATCH_S

    def wobbling(elapsed_s: float) -> float:
        # 30 items/s (one and a half replicas' worth), +-20% in a 3 s cycle.
        phase = int(elapsed_s * 2) % 6
        return 30 * (0.8, 1.0, 1.2, 1.2, 1.0, 0.8)[phase]

    async with stack(tmp_path, monkeypatch) as (server, cluster):
        await create(server, slow_adder("steady", batch_s, autoscaling=autoscaling))
        await eventually(lambda: len(ready(cluster, "steady")) == 1, timeout_s=START_S, what="one replica")
        load = traffic(cluster, "steady", rate=wobbling)
        sending = asyncio.create_task(load.run(duration_s=load_s))
        ends = time.monotonic() + load_s
        counts: list[int] = []
        try:
            # Every poll for 45 s of steady load: the count first rises (a backlog built up on one
            # replica asks for more than the load needs), then settles down step by step. Not after:
            # the last answers may take seconds on a starved machine, and the load has gone by then.
            while time.monotonic() < ends and not sending.done():
                counts.append(cr(server, "steady")["status"]["desired_replicas"])
                await asyncio.sleep(POLL_S)
        finally:
            load.stop()
            outcomes = await sending
        peak = counts.index(max(counts))
        changes = [b - a for a, b in itertools.pairwise(counts[peak:]) if b != a]
        turns = sum(1 for a, b in itertools.pairwise(changes) if (a > 0) != (b > 0))
        # No flap: once it has started coming down the count settles. The stabilization windows
        # let it turn only when every ask of a whole window was on the other side, and a load that
        # wobbles across a boundary on a machine whose speed varies may do that once or twice; an
        # autoscaler whose windows were lost (say, a new one every poll) turns at most polls.
        assert turns <= 3, f"{turns} turns after the peak: {counts}"
        # 30 items/s: about three replicas' worth.
        assert max(counts) > 1 and 2 <= counts[-1] <= 4, f"{counts}"
    assert not unanswered(outcomes)
