"""Tracing through the router, on real parts: the router and `batchd serve` replicas as processes
exporting to a real Jaeger, read back through its query API. A client's request to a composer,
whose model calls another deployment through the router, is one trace: the client's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchd.testing.jaeger import Span, StartJaeger
from batchd.testing.kubernetes.routed import access_secret
from batchd.testing.manifests import manifest
from batchd.testing.servers import start_replica, write_manifest

pytestmark = pytest.mark.slow

ADDER = "batchd.testing.batch_handlers:add_one"
TRACE = "5bf92f3577b34da6a3ce929d0e0e4736"
OTHER = ("6bf92f3577b34da6a3ce929d0e0e4736", "7bf92f3577b34da6a3ce929d0e0e4736")
CLIENT_SPAN = "b7ad6b7169203331"


def traceparent(trace_id: str, sampled: bool = True) -> str:
    return f"00-{trace_id}-{CLIENT_SPAN}-{'01' if sampled else '00'}"


def _one(spans: list[Span], service: str, kind: str, name: str | None = None) -> Span:
    found = [s for s in spans if s.service == service and s.kind == kind and (name is None or s.name == name)]
    assert len(found) == 1, [(s.service, s.kind, s.name) for s in spans]
    return found[0]


async def test_a_composed_request_through_the_router_is_one_trace(
    cluster: Any, start_jaeger: StartJaeger, tmp_path: Path
) -> None:
    """Client -> router -> composer -> (batch) -> router -> callee: one trace in Jaeger, the client's,
    with the composer's batch span linked to the recorded request it carried; the requests whose
    callers chose not to record them leave no trace anywhere."""
    jaeger = start_jaeger(cluster.host)
    callee_path = write_manifest(tmp_path, manifest("callee", ADDER))
    composer = manifest(
        "composer",
        {"handler": "batchd.testing.batch_handlers:Relay", "calls": {"adder": "callee"}},
        batching={"max_batch_size": 3, "batch_wait_timeout_s": 30},
    )
    composer_path = write_manifest(tmp_path, composer)
    async with cluster.router(env={**jaeger.environment(), "OTEL_SERVICE_NAME": "batchd-router"}) as router:
        callee = start_replica(
            callee_path,
            tmp_path / "logs",
            host=cluster.host,
            env={**jaeger.environment(), "OTEL_SERVICE_NAME": "callee"},
        )
        addresses = f'{{"adder": "{router.url}/deployments/{cluster.namespace}/callee"}}'
        caller = start_replica(
            composer_path,
            tmp_path / "logs",
            host=cluster.host,
            env={**jaeger.environment(), "OTEL_SERVICE_NAME": "composer", "BATCHD_CALLS": addresses},
        )
        try:
            for replica in (callee, caller):
                await asyncio.to_thread(replica.wait_ready, 180)
            await cluster.deploy("callee", f"{callee.host}:{callee.port}")
            await cluster.deploy("composer", f"{caller.host}:{caller.port}")
            # One client whose trace is recorded, two whose callers chose not to (so the batch's span
            # can only be in the first one's trace).
            headers = [
                traceparent(TRACE),
                traceparent(OTHER[0], sampled=False),
                traceparent(OTHER[1], sampled=False),
            ]
            async with httpx.AsyncClient(timeout=60) as client:
                answers = await asyncio.gather(
                    *(
                        client.post(
                            f"{router.url}/v1/models/composer:predict",
                            json={"instances": [{"to": "adder", "n": n}]},
                            headers={"traceparent": header},
                        )
                        for n, header in enumerate(headers)
                    )
                )
            assert [a.json() for a in answers] == [{"predictions": [n + 1]} for n in range(3)]
        finally:
            for replica in (caller, callee):
                replica.stop()

    def complete(spans: list[Span]) -> bool:
        kinds = {(s.service, s.kind) for s in spans}
        calls = sum(1 for s in spans if s.service == "callee" and s.kind == "server")
        return calls == 3 and {("composer", "internal"), ("callee", "internal")} <= kinds

    spans = jaeger.wait_for_trace(
        TRACE, complete, "the composed trace: router, composer, batch, calls, callee"
    )
    assert {s.trace_id for s in spans} == {TRACE}  # the client's trace, continued
    routed = _one([s for s in spans if s.tags.get("batchd.model") == "composer"], "batchd-router", "server")
    assert routed.parent == CLIENT_SPAN  # the client's span: never a new trace beside it
    request = _one(spans, "composer", "server")
    assert request.parent == routed.span_id  # the router sent its own context on
    batch = _one(spans, "composer", "internal")  # in this trace: a child of its one recorded request
    assert batch.tags["batchd.batch.size"] == 3
    # Linked to the one recorded request it carried (Jaeger shows a link to the span's own parent
    # in place of the parent reference); the others have no span to link to, anywhere.
    assert batch.links == ((TRACE, request.span_id),)
    assert batch.tags["batchd.batch.requests"] == 1
    assert all(jaeger.trace(other) == [] for other in OTHER)
    calls = [s for s in spans if s.service == "composer" and s.kind == "client"]
    assert len(calls) == 3 and all(call.parent == batch.span_id for call in calls)
    routers = {s.span_id: s for s in spans if s.service == "batchd-router"}
    for callee_request in (s for s in spans if s.service == "callee" and s.kind == "server"):
        assert callee_request.parent in routers
        assert routers[callee_request.parent].parent in {call.span_id for call in calls}


async def test_a_callers_sampled_flag_records_only_where_its_tenant_is_trusted(
    cluster: Any, fakes: Any, start_jaeger: StartJaeger
) -> None:
    """The router records no new trace (ratio 0): a sampled `traceparent` from a tenant that is not
    trusted joins its trace and records nothing, at the router or the replica (its flag goes on off);
    the same from a trusted tenant is recorded, and so is a trusted caller's choice not to be."""
    jaeger = start_jaeger(cluster.host)
    replica = fakes("ok")
    secret = access_secret("adder", cluster.namespace, {"plain": ["plain-key"], "trusted": ["trusted-key"]})
    assert cluster.api.post(f"/api/v1/namespaces/{cluster.namespace}/secrets", json=secret).is_success
    access = {
        "tenants": [
            {"name": "plain", "api_keys_secret": "plain-keys"},
            {"name": "trusted", "api_keys_secret": "trusted-keys", "trust_traces": True},
        ]
    }
    await cluster.deploy("adder", replica.address, access=access)
    env = {**jaeger.environment(sampling_ratio=0.0), "OTEL_SERVICE_NAME": "batchd-router"}
    forced, trusted = OTHER
    async with cluster.router(env=env) as router, httpx.AsyncClient(timeout=30) as client:
        for key, trace_id in (("plain-key", forced), ("trusted-key", trusted), ("trusted-key", TRACE)):
            answer = await client.post(
                f"{router.url}/v1/models/adder:predict",
                json={"instances": [1]},
                headers={"x-api-key": key, "traceparent": traceparent(trace_id, sampled=trace_id != TRACE)},
            )
            assert answer.status_code == 200, answer.text
    sent = [seen[b"traceparent"].decode() for seen in replica.headers]
    assert sent[0] == traceparent(forced, sampled=False)  # its trace, with nothing recorded
    assert sent[1].startswith(f"00-{trusted}-") and sent[1].endswith("-01") and CLIENT_SPAN not in sent[1]
    assert sent[2] == traceparent(TRACE, sampled=False)  # a trusted caller's choice holds too
    routed = jaeger.wait_for_trace(trusted, lambda spans: bool(spans), "the trusted caller's trace")
    assert _one(routed, "batchd-router", "server").parent == CLIENT_SPAN
    # Sent before it, through the same exporter: had it been recorded, it would be there by now.
    assert jaeger.trace(forced) == [] and jaeger.trace(TRACE) == []
