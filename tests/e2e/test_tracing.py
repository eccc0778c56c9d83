"""Tracing end to end on a real cluster: the chart's router and the operator's replica pods, from
our images, exporting to a real Jaeger that the pods reach on the cluster's address, read back
through Jaeger's query API as a person would through its UI.

What an operator of the deployment notices: a request through the router to a composer, whose
model calls another deployment, is one trace, the client's. It holds the router's span, the
composer's request, batch and call spans, and the router's and the callee's spans of each call;
the composer's batch span is linked to every request that rode in it, each in its own trace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from batchd.testing.jaeger import Jaeger, Span, StartJaeger
from batchd.testing.kubernetes import handlers
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import ONE_ROUTER, Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow

START_S = 150.0  # a replica pod starts in seconds; the machine may be busy
EXPORT_S = 60.0  # the pods' batch span processor sends every 5 s (its default); a busy node is slower
ADDER = "batchd.testing.batch_handlers:add_one"
RELAY = "batchd.testing.batch_handlers:Relay"
ROUTER_SERVICE = "batchd-router"  # the chart's OTEL_SERVICE_NAME of the router
CLIENT_SPAN = "b7ad6b7169203331"
TRACES = tuple(f"5bf92f3577b34da6a3ce929d0e0e47{n:02x}" for n in range(3))  # one per client request


@pytest.fixture
def traced(
    control_plane: ControlPlane, kube_node: Node, start_jaeger: StartJaeger, tmp_path: Any
) -> Iterator[tuple[Release, Jaeger]]:
    """The chart installed with its router tracing to a Jaeger on the cluster's address."""
    jaeger = start_jaeger(control_plane.address)
    values = {**ONE_ROUTER, "tracing": {"endpoint": jaeger.otlp_endpoint, "samplingRatio": 1}}
    with installed(control_plane, tmp_path, values, wait=True) as release:
        release.apply(handlers.config_map())
        yield release, jaeger


def _one(spans: list[Span], service: str, kind: str) -> Span:
    found = [s for s in spans if s.service == service and s.kind == kind]
    assert len(found) == 1, [(s.service, s.kind, s.name) for s in spans]
    return found[0]


@pytest.mark.timeout(2 * START_S + 4 * EXPORT_S)  # two deployments' pods, then Jaeger's reads
async def test_a_composed_request_through_the_router_is_one_trace_with_its_batch_linked_to_every_request(
    traced: tuple[Release, Jaeger],
) -> None:
    release, jaeger = traced
    tracing = {"endpoint": jaeger.otlp_endpoint, "sampling_ratio": 1}
    release.apply(manifest("callee", ADDER, tracing=tracing, **handlers.pod_spec()))
    release.apply(
        manifest(
            "composer",
            {"handler": RELAY, "calls": {"adder": "callee"}},
            # The three requests ride in one batch: it leaves when full.
            batching={"max_batch_size": 3, "batch_wait_timeout_s": 30},
            tracing=tracing,
            **handlers.pod_spec(),
        )
    )
    for name in ("callee", "composer"):
        eventually(
            lambda name=name: release.pods(name, ready=True),  # type: ignore[misc]
            timeout_s=START_S,
            what=f"{name} ready",
        )
    router = release.router_url()
    url = f"{router}/v1/models/composer:predict"
    await asyncio.to_thread(
        release.first_answer, f"{router}/v1/models/callee:predict", {"instances": [0]}, START_S
    )

    async with httpx.AsyncClient(timeout=90) as client:
        answers = await asyncio.gather(
            *(
                client.post(
                    url,
                    json={"instances": [{"to": "adder", "n": n}]},
                    headers={"traceparent": f"00-{trace}-{CLIENT_SPAN}-01"},
                )
                for n, trace in enumerate(TRACES)
            )
        )
    assert [a.json() for a in answers] == [{"predictions": [n + 1]} for n in range(3)]

    # Every client's trace is continued: the router's span under the client's, the composer's
    # request under the router's.
    requests: dict[str, Span] = {}
    for trace in TRACES:
        spans = jaeger.wait_for_trace(
            trace,
            lambda spans: (
                {("composer", "server"), (ROUTER_SERVICE, "server")} <= {(s.service, s.kind) for s in spans}
            ),
            f"trace {trace}: the router's span and the composer's request",
            timeout_s=EXPORT_S,
        )
        assert {s.trace_id for s in spans} == {trace}
        routed = next(s for s in spans if s.service == ROUTER_SERVICE and s.parent == CLIENT_SPAN)
        assert routed.tags["batchd.router.replica"]  # it names the pod it chose
        requests[trace] = _one(spans, "composer", "server")
        assert requests[trace].parent == routed.span_id

    # The batch's span is in one of them (a child of its first request), with the calls, and the
    # router's and the callee's spans of each call.
    def complete(spans: list[Span]) -> bool:
        kinds = [(s.service, s.kind) for s in spans]
        return (
            ("composer", "internal") in kinds
            and kinds.count(("callee", "server")) == 3
            and (("callee", "internal") in kinds)
        )

    def batch_trace() -> list[Span]:
        for trace in TRACES:
            spans = jaeger.trace(trace)
            if complete(spans):
                return spans
        return []

    spans = eventually(
        batch_trace, timeout_s=EXPORT_S, what="the trace holding the composer's batch and its calls"
    )
    batch = _one(spans, "composer", "internal")
    assert batch.tags["batchd.batch.size"] == 3 and batch.tags["batchd.batch.requests"] == 3
    # Linked to every request it carried, each in its own trace (Jaeger shows a link to the span's
    # own parent in place of the parent reference).
    assert set(batch.links) | ({(batch.trace_id, batch.parent)} if batch.parent else set()) == {
        (trace, request.span_id) for trace, request in requests.items()
    }
    calls = [s for s in spans if s.service == "composer" and s.kind == "client"]
    assert len(calls) == 3 and all(call.parent == batch.span_id for call in calls)
    routers = {s.span_id: s for s in spans if s.service == ROUTER_SERVICE}
    for callee_request in (s for s in spans if s.service == "callee" and s.kind == "server"):
        assert callee_request.parent is not None
        hop = routers[callee_request.parent]  # the router's span of that call ...
        assert hop.parent in {call.span_id for call in calls}  # ... under the composer's call span
        assert hop.tags["batchd.deployment"].endswith("/callee")
    assert any(s.service == "callee" and s.kind == "internal" for s in spans)  # the callee's batch
