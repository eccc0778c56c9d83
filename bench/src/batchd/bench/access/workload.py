"""The rounds: one router in front of the trivial floor, reached three ways (access off, an API key,
a ServiceAccount token), each way measured in turn every repeat; the router's TokenReviews read from
the API server's audit log."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from concurrent.futures import Future
from pathlib import Path

from batchd.bench.access.analysis import Results, Reviews, Round
from batchd.bench.access.decision import decision_cost
from batchd.bench.access.options import OFF, Options
from batchd.bench.access.probe import ProbeReplica, run_probe, start_probe_replica
from batchd.bench.kit import floor
from batchd.bench.kit.loadgen import Request
from batchd.bench.kit.proxycost import measure_through
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import interleaved
from batchd.router.token_reviews import ALLOWED_TTL_S
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.routed import RouterNamespaces

OPEN, GUARDED = "open-adder", "guarded-adder"
BODY = b'{"instances": [1]}'
API_KEY = "bench-key-0123456789abcdef0123456789abcdef"
CALLER = "caller"  # the ServiceAccount whose token is the third way in


def _access(namespace: str) -> dict[str, object]:
    """The guarded deployment's tenants: an API key's and the caller ServiceAccount's."""
    return {
        "tenants": [
            {"name": "keyed", "api_keys_secret": "keyed-keys"},
            {"name": "robots", "service_accounts": [f"{namespace}/{CALLER}"]},
        ]
    }


def _path(model: str) -> str:
    return f"/v1/models/{model}:predict"


async def run(
    options: Options,
    cluster: ControlPlane,
    workdir: Path,
    meta: RunRecord,
    probe_model: Future[Path] | None = None,
) -> Results:
    """The rounds, the reviews, the decision and, given `probe_model` (its model being built), the
    probe."""
    source: Path | None = None
    if probe_model is not None:
        source = await asyncio.wrap_future(probe_model)
    upstream = floor.start(workdir, host=cluster.address)
    replica: ProbeReplica | None = None
    rounds: list[Round] = []
    try:
        if source is not None and not options.quiet_start:
            replica = start_probe_replica(source, cluster.address, workdir, options.probe_threads)
        await asyncio.to_thread(upstream.wait_ready, 60.0)
        async with RouterNamespaces(cluster, workdir) as namespaces:
            namespaces.grant_token_reviews()
            token = namespaces.invoker_token(CALLER)
            # Every deployment has its access Secret (the operator makes one for an open deployment
            # too), so every way in is stamped and signed: what differs is the credential.
            namespaces.put_access_secret(OPEN, {})
            namespaces.put_access_secret(GUARDED, {"keyed": [API_KEY]})
            address = f"{upstream.host}:{upstream.port}"
            await namespaces.deploy(OPEN, address)
            await namespaces.deploy(GUARDED, address, access=_access(namespaces.namespace))
            async with namespaces.router() as router:
                host, port = router.host, router.port
                requests = {
                    OFF: Request.post_json(host, port, _path(OPEN), BODY),
                    "key": Request.post_json(host, port, _path(GUARDED), BODY, {"x-api-key": API_KEY}),
                    "token": Request.post_json(
                        host, port, _path(GUARDED), BODY, {"authorization": f"Bearer {token}"}
                    ),
                }
                reviews_before = cluster.created(namespaces.router_user, "tokenreviews")
                token_started = token_ended = None
                for repeat, way in interleaved(list(requests), options.repeats):
                    print(f"access, round {repeat + 1}/{options.repeats}: {way}", flush=True)
                    started = time.monotonic()
                    through = await measure_through(
                        host,
                        port,
                        requests[way],
                        router,
                        options.in_flight,
                        options.seconds,
                        options.warmup_s,
                    )
                    if way == "token":
                        token_started = token_started or started
                        token_ended = time.monotonic()
                    router.check_alive()
                    rounds.append(
                        Round(
                            way,
                            repeat,
                            through.requests,
                            through.errors,
                            through.p50_ms,
                            through.p99_ms,
                            through.rps,
                            through.cpu_us,
                        )
                    )
                reviews = cluster.created(namespaces.router_user, "tokenreviews") - reviews_before
                probe = None
                if source is not None:
                    replica = replica or start_probe_replica(
                        source, cluster.address, workdir, options.probe_threads
                    )
                    probe = await run_probe(options.probe_tries, namespaces, router.url, replica)
    finally:
        # After the router: a replica the router still holds connections to takes longer to stop.
        if replica is not None:
            replica.process.stop()
        upstream.stop()
    assert token_started is not None and token_ended is not None
    decision = await decision_cost(options.decision_iterations, options.decision_rounds)
    return Results(
        meta,
        dataclasses.asdict(options),
        rounds,
        Reviews(reviews, (token_ended - token_started) / 60, ALLOWED_TTL_S),
        probe,
        decision,
    )
