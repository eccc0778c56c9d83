"""Autoscaling, scale to zero and live retuning on a real cluster: the operator on the chart's
ServiceAccount, the chart's router in a pod, replicas as pods of the node, load through the
router's Service as clients send it.

The handler holds every batch for a fixed time, as a GPU does for a batch of any size up to its
limit, so one replica serves at most max_batch_size / BATCH_S items a second. The operator reads
its replicas every POLL_S (the chart's default is 5 s; a test has no minutes to spare).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from batchd.api.manifest import parse_manifest
from batchd.api.pod import REPLICA_METRICS_PORT
from batchd.api.revisions import batching_revision_of
from batchd.api.spec import GROUP, PLURAL, VERSION
from batchd.testing.kubernetes import handlers
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import ONE_ROUTER, Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.promtext import parse_histogram
from batchd.testing.traffic import Traffic, unanswered
from batchd.testing.waiting import NotYet, eventually

pytestmark = pytest.mark.slow

BATCH_S = 0.1  # every batch holds the model this long
MAX_BATCH = 4  # so one replica serves at most 40 items/s
POLL_S = 0.25  # the operator reads every ready replica this often
QUEUE = 64
BATCHES = 10  # batches each replica runs under one batching before its sizes are compared
START_S = 90.0
SCALE_UP_S = 180.0
TO_ZERO_DELAY_S = 2  # scale_to_zero_delay_s
OPERATOR_ENV = {
    "BATCHD_REPLICA_POLL_INTERVAL_S": str(POLL_S),
    "BATCHD_AUTOSCALING_STATUS_INTERVAL_S": str(POLL_S),
    "BATCHD_WAKE_POLL_INTERVAL_S": str(POLL_S),
    # A 1 s preStop: endpoints drop a pod before it stops listening, and scale-downs end sooner.
    "BATCHD_DRAIN_DELAY_S": "1",
}
# A replica's start on a test node that shares two cores with the rest of the suite can take
# longer than the chart's 30 s hold, which is sized for a warm GPU node.
VALUES = {"router": {**ONE_ROUTER["router"], "hold": {"timeoutSeconds": 120}}}


@pytest.fixture(scope="module")
def release(
    control_plane: ControlPlane, kube_node: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    logs = tmp_path_factory.mktemp("autoscaling")
    with installed(control_plane, logs, VALUES, wait=True) as release:
        release.apply(handlers.config_map())
        with release.operator(logs / "operator.log", env=OPERATOR_ENV):
            yield release


def slow_adder(release: Release, name: str, batch_s: float = BATCH_S, **spec: Any) -> None:
    model = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": batch_s}}
    # A queue of QUEUE items (under 2 s of waiting at one replica's rate): while replicas start,
    # what does not fit is refused at once with Retry-After, rather than waiting past the client.
    spec.setdefault(
        "batching", {"max_batch_size": MAX_BATCH, "batch_wait_timeout_s": 0.02, "max_queued_requests": QUEUE}
    )
    release.apply(manifest(name, model, **handlers.pod_spec(), **spec))


def status(release: Release, name: str) -> dict[str, Any]:
    found: dict[str, Any] = (release.get("bd", name) or {}).get("status") or {}
    return found


def traffic(release: Release, name: str, rate: float | Any) -> Traffic:
    url = release.router_url()
    return Traffic(lambda: [url], f"/v1/models/{name}:predict", b'{"instances": [1]}', rate)


# Its waits add up past the suite's 300 s per test on a starved machine: a start, a scale-up, a
# scale-down.
@pytest.mark.timeout(START_S + SCALE_UP_S + 120)
async def test_load_scales_up_until_the_queues_are_under_target_then_back_down_losing_nothing(
    release: Release,
) -> None:
    # Room above the four replicas the load needs: on a starved machine every item takes longer,
    # each replica holds more, and the autoscaler rightly asks for a fifth or a sixth.
    autoscaling = {"min_replicas": 1, "max_replicas": 6, "upscale_delay_s": 1, "downscale_delay_s": 4}
    slow_adder(release, "auto", autoscaling=autoscaling)
    await asyncio.to_thread(
        eventually, lambda: len(release.pods("auto", ready=True)) == 1, timeout_s=START_S, what="one replica"
    )

    # Twice what one replica can serve. Each replica then holds what arrives while a batch runs
    # and the one before it finishes (Little's law: about 3.2 items at 20 items/s each with 4
    # replicas, 4.3 with 3): under the target of 4 a replica with 4, over it with 3.
    load = traffic(release, "auto", rate=80)
    # Sent until the replicas carry it: about a minute here, three beside a CPU hog, where five
    # replicas start at once on a node whose two cores are busy with everything else.
    sending = asyncio.create_task(load.run(duration_s=SCALE_UP_S))
    try:

        def carried() -> bool | NotYet:
            # Enough ready replicas that each holds no more than its target (max_batch_size).
            scaling = status(release, "auto").get("autoscaling", {})
            serving = len(release.pods("auto", ready=True))
            if serving >= 3 and scaling.get("ready_replicas") == serving and scaling["load"] <= 4 * serving:
                return True
            return NotYet(f"{serving} pods ready; the operator's figures: {scaling}")

        await asyncio.to_thread(
            eventually, carried, timeout_s=SCALE_UP_S, what="replicas that carry the load"
        )
    finally:
        load.stop()
        outcomes = await sending
    assert release.events("ScaledUp")

    # Idle now: back to the minimum once the downscale delay has passed.
    await asyncio.to_thread(
        eventually,
        lambda: len(release.pods("auto")) == 1 and status(release, "auto")["desired_replicas"] == 1,
        timeout_s=60,
        what="scale back to min_replicas",
    )
    assert "enough for 4 s" in status(release, "auto")["autoscaling"]["last_scale_reason"]
    eventually(lambda: release.events("ScaledDown"), what="a ScaledDown event")
    assert len(outcomes) > 500
    lost = unanswered(outcomes)
    assert not lost, f"{len(lost)} of {len(outcomes)} requests got no usable answer, e.g. {lost[:3]}"


async def test_steady_load_does_not_flap(release: Release) -> None:
    load_s = 30.0
    # Both windows span a whole cycle of the wobble below (3 s), so the wobble alone moves nothing.
    autoscaling = {"min_replicas": 1, "max_replicas": 6, "upscale_delay_s": 3, "downscale_delay_s": 4}

    # Batches twice as long, so half the requests are one and a half replicas' worth: every request
    # costs CPU (client, router, replica) and a batch only time, and the count must follow the
    # load, not how busy the machine is.
    batch_s = 2 * BATCH_S

    def wobbling(elapsed_s: float) -> float:
        # 30 items/s (one and a half replicas' worth), +-20% in a 3 s cycle.
        phase = int(elapsed_s * 2) % 6
        return 30 * (0.8, 1.0, 1.2, 1.2, 1.0, 0.8)[phase]

    slow_adder(release, "steady", batch_s, autoscaling=autoscaling)
    await asyncio.to_thread(
        eventually,
        lambda: len(release.pods("steady", ready=True)) == 1,
        timeout_s=START_S,
        what="one replica",
    )
    load = traffic(release, "steady", rate=wobbling)
    sending = asyncio.create_task(load.run(duration_s=load_s))
    ends = time.monotonic() + load_s
    counts: list[int] = []
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{release.namespace}/{PLURAL}/steady"
    # One client for every read: a poll costs the machine a request, not a kubectl process.
    with release.cluster.client() as api:
        try:
            # Every poll for 30 s of steady load: the count first rises (a backlog built up on one
            # replica asks for more than the load needs), then settles down step by step. Not
            # after: the last answers may take seconds on a starved machine, and the load has gone.
            while time.monotonic() < ends and not sending.done():
                found = await asyncio.to_thread(api.get, path)
                counts.append(found.json()["status"]["desired_replicas"])
                await asyncio.sleep(POLL_S)
        finally:
            load.stop()
            outcomes = await sending
    peak = counts.index(max(counts))
    changes = [b - a for a, b in itertools.pairwise(counts[peak:]) if b != a]
    turns = sum(1 for a, b in itertools.pairwise(changes) if (a > 0) != (b > 0))
    # No flap: once it has started coming down the count settles. The stabilization windows let it
    # turn only when every ask of a whole window was on the other side, and a load that wobbles
    # across a boundary on a machine whose speed varies may do that once or twice; an autoscaler
    # whose windows were lost (say, a new one every poll) turns at most polls.
    assert turns <= 3, f"{turns} turns after the peak: {counts}"
    # 30 items/s: one and a half replicas' worth, held by at least two. (On a node starved by the
    # rest of the machine each replica holds more, and the count may rightly stay at the top for
    # the whole load; coming back down is the scale-down test's.)
    assert max(counts) > 1 and counts[-1] >= 2, f"{counts}"
    assert not unanswered(outcomes)


def test_an_idle_deployment_goes_to_zero_and_a_request_through_the_router_wakes_it(release: Release) -> None:
    autoscaling = {"min_replicas": 0, "max_replicas": 2, "scale_to_zero_delay_s": TO_ZERO_DELAY_S}
    release.apply(manifest("sleepy", num_replicas=1, autoscaling=autoscaling))
    eventually(lambda: release.pods("sleepy", ready=True), timeout_s=120, what="the first replica")

    condition = eventually(
        lambda: (found := release.condition("sleepy", "Ready")).get("reason") == "ScaledToZero" and found,
        timeout_s=60,
        what="Ready=False ScaledToZero",
    )
    assert "a request through the router starts a replica" in condition["message"]
    eventually(lambda: not release.pods("sleepy"), timeout_s=60, what="the replica pod gone")
    # Two events of that reason: the scale, and the Ready condition's transition.
    went = eventually(
        lambda: [m for m in release.events("ScaledToZero", "sleepy") if m.startswith("1 -> 0")],
        what="the ScaledToZero event",
    )
    assert went == [
        f"1 -> 0 replicas: idle for {TO_ZERO_DELAY_S} s: "
        "no item on the replicas, no request held by the routers"
    ]

    # The request a client sends, to the Service the deployment's status names.
    url = (release.get("bd", "sleepy") or {})["status"]["url"]
    assert url.startswith(f"http://{release.name}-router.{release.namespace}.svc")
    router = release.router_url()
    sent = time.monotonic()
    answer = httpx.post(
        f"{router}/v1/models/sleepy:predict",
        json={"instances": [1, 2]},
        timeout=150,
    )
    cold_start_s = time.monotonic() - sent
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"predictions": [2, 3]}
    (woke,) = eventually(lambda: release.events("ScaledFromZero", "sleepy"), what="the ScaledFromZero event")
    assert woke.startswith("0 -> 1 replicas: 1 request(s) held by the routers"), woke
    assert len(release.pods("sleepy", ready=True)) == 1
    print(f"cold start through the router: {cold_start_s:.1f} s")


def batch_sizes(pod: dict[str, Any]) -> tuple[float, float]:
    # Prometheus' own scrape timeout: a replica under load on a starved node may take seconds.
    metrics = httpx.get(f"http://{pod['status']['podIP']}:{REPLICA_METRICS_PORT}/metrics", timeout=10).text
    histogram = parse_histogram(metrics, "batchd_batch_size")
    return histogram.count, histogram.sum


def batches_since(replicas: list[dict[str, Any]], since: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Wait (bounded) until every replica has run BATCHES batches after `since` (each one's batch
    and item counts then); the mean batch size of each since."""

    def grown() -> dict[str, float] | NotYet:
        try:
            now = {pod["metadata"]["name"]: batch_sizes(pod) for pod in replicas}
        except httpx.TimeoutException as error:  # a slow scrape is asked again at the next poll
            return NotYet(f"a replica's /metrics did not answer: {error!r}")
        ran = {name: (count - since[name][0], items - since[name][1]) for name, (count, items) in now.items()}
        if all(count >= BATCHES for count, _ in ran.values()):
            return {name: items / count for name, (count, items) in ran.items()}
        return NotYet(f"batches and items run since: {ran}")

    return eventually(grown, timeout_s=60, what=f"{BATCHES} batches on every replica")


def containers(replicas: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(pod, container ID): a restarted container or a replaced pod changes it."""
    return {
        (pod["metadata"]["name"], pod["status"]["containerStatuses"][0]["containerID"]) for pod in replicas
    }


async def test_a_batching_change_under_load_reaches_the_same_processes_and_fails_nothing(
    release: Release,
) -> None:
    slow_adder(
        release, "retuned", num_replicas=2, batching={"max_batch_size": 2, "batch_wait_timeout_s": 0.02}
    )
    replicas = await asyncio.to_thread(
        eventually,
        lambda: found if len(found := release.pods("retuned", ready=True)) == 2 else [],
        timeout_s=START_S,
        what="two replicas",
    )
    await asyncio.to_thread(
        eventually, lambda: status(release, "retuned").get("batching", {}).get("applied"), what="status"
    )
    load = traffic(release, "retuned", rate=50)
    sending = asyncio.create_task(load.run(duration_s=120))  # stopped once the test has seen enough
    try:
        first = await asyncio.to_thread(
            batches_since, replicas, {pod["metadata"]["name"]: (0, 0) for pod in replicas}
        )
        assert all(mean <= 2 for mean in first.values()), first

        slow_adder(
            release, "retuned", num_replicas=2, batching={"max_batch_size": 8, "batch_wait_timeout_s": 0.1}
        )
        revision = batching_revision_of(parse_manifest(release.get("bd", "retuned")).spec.batching)

        def applied() -> bool:
            batching = status(release, "retuned").get("batching", {})
            return bool(
                batching
                == {
                    **batching,
                    "revision": revision,
                    "applied": True,
                    "ready_replicas_applied": 2,
                }
            )

        await asyncio.to_thread(
            eventually, applied, timeout_s=45, what="every ready replica on the new batching revision"
        )
        middle = {pod["metadata"]["name"]: batch_sizes(pod) for pod in replicas}
        after = await asyncio.to_thread(batches_since, replicas, middle)
    finally:
        load.stop()
        outcomes = await sending

    assert all(mean > 2 for mean in after.values()), f"batches did not grow: {after}"
    # The same containers: the change reached them in place, nothing restarted or rolled.
    assert containers(release.pods("retuned", ready=True)) == containers(replicas)
    assert outcomes and not [outcome for outcome in outcomes if outcome.status != 200]
