"""The replica's spans, read from the SDK's in-memory exporter: a SERVER span per request that
continues the caller's trace, a batch span linked to every request it carried, a CLIENT span per
call to another deployment whose context the callee continues, a span per decoding run of
token-level generation linked to every request in it, prompt text only where the deployment opted
in, and exemplars on the latency histogram. The real exporter and a real Jaeger are
`tests/e2e/test_tracing.py`'s, `tests/router/test_tracing.py`'s and `tests/replica/test_jaeger.py`'s."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from batchd.api.manifest import parse_manifest
from batchd.api.tracing import pipeline
from batchd.api.tracing_config import TracingConfig
from batchd.replica.front.app import create_app
from batchd.replica.front.server import replica_protocol
from batchd.replica.settings import ReplicaSettings
from batchd.replica.tracing import ReplicaTracing
from batchd.testing.manifests import manifest
from batchd.testing.models import build_gpt2
from batchd.testing.servers import uvicorn_in_thread
from batchd.testing.waiting import eventually

MODEL = "adder"
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
BATCH = 4


def traceparent(sampled: bool = True) -> str:
    return f"00-{CALLER_TRACE}-{CALLER_SPAN}-{'01' if sampled else '00'}"


class Traced:
    """A replica on real uvicorn, its spans kept in memory."""

    def __init__(self, url: str, exporter: InMemorySpanExporter) -> None:
        self.url = url
        self.exporter = exporter

    def spans(self, count: int) -> list[ReadableSpan]:
        return eventually(
            lambda: (spans := list(self.exporter.get_finished_spans())) and len(spans) >= count and spans,
            what=f"{count} finished spans",
        )


@contextmanager
def serve(
    document: dict[str, Any],
    direct: bool = True,
    calls: dict[str, str] | None = None,
    config: TracingConfig | None = None,
) -> Iterator[Traced]:
    exporter = InMemorySpanExporter()
    spans = pipeline("test", SimpleSpanProcessor(exporter))
    parsed = parse_manifest(document)
    tracing = ReplicaTracing(spans, parsed, config or TracingConfig())
    app = create_app(parsed, ReplicaSettings(calls=calls or {}), tracing=tracing)
    with uvicorn_in_thread(app, http=replica_protocol(app, access_log=not direct)) as url:
        exporter.clear()  # the readiness probes' requests are no inference routes: nothing, but be sure
        yield Traced(url, exporter)
    spans.shutdown()


@pytest.fixture(scope="module", params=["direct", "asgi"])
def adder(request: pytest.FixtureRequest) -> Iterator[Traced]:
    # A batch leaves when full: BATCH concurrent requests are one batch.
    batching = {"max_batch_size": BATCH, "batch_wait_timeout_s": 30}
    document = manifest(MODEL, "batchd.testing.batch_handlers:add_one", batching=batching)
    with serve(document, direct=request.param == "direct") as traced:
        yield traced


async def predict_together(url: str, headers: list[dict[str, str]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await asyncio.gather(
            *(
                client.post(f"/v1/models/{MODEL}:predict", json={"instances": [n]}, headers=h)
                for n, h in enumerate(headers)
            )
        )


def by_kind(spans: list[ReadableSpan], kind: SpanKind) -> list[ReadableSpan]:
    return [span for span in spans if span.kind == kind]


def test_a_batch_span_is_linked_to_every_request_it_carried(adder: Traced) -> None:
    adder.exporter.clear()
    headers = [{"traceparent": traceparent()}] + [{} for _ in range(BATCH - 1)]
    answers = asyncio.run(predict_together(adder.url, headers))
    assert [answer.json() for answer in answers] == [{"predictions": [n + 1]} for n in range(BATCH)]

    spans = adder.spans(BATCH + 1)
    requests = by_kind(spans, SpanKind.SERVER)
    (batch,) = by_kind(spans, SpanKind.INTERNAL)
    assert len(requests) == BATCH
    linked = {link.context.span_id for link in batch.links}
    assert linked == {request.context.span_id for request in requests}
    assert batch.attributes is not None and batch.attributes["batchd.batch.size"] == BATCH
    assert isinstance(batch.attributes["batchd.batch.model_s"], float)
    # The batch is a child of a request it carried: that request's trace shows it.
    assert batch.parent is not None
    assert batch.parent.span_id in linked
    for request in requests:
        attributes = request.attributes
        assert attributes is not None
        assert attributes["http.response.status_code"] == 200
        assert attributes["http.route"] == "/v1/models/{name}:predict"
        assert attributes["batchd.priority_class"] == "default"
        assert isinstance(attributes["batchd.queue.duration_s"], float)
        assert "gen_ai.operation.name" not in attributes  # a custom handler is no GenAI operation


def test_a_callers_traceparent_is_continued(adder: Traced) -> None:
    adder.exporter.clear()
    asyncio.run(predict_together(adder.url, [{"traceparent": traceparent()}] * BATCH))
    requests = by_kind(adder.spans(BATCH + 1), SpanKind.SERVER)
    for request in requests:
        assert format(request.context.trace_id, "032x") == CALLER_TRACE
        assert request.parent is not None and format(request.parent.span_id, "016x") == CALLER_SPAN
        assert request.parent.is_remote


def test_a_caller_that_does_not_sample_is_followed(adder: Traced) -> None:
    """Parent-based sampling: the caller's decision holds, so its trace is kept or dropped whole."""
    adder.exporter.clear()
    answers = asyncio.run(predict_together(adder.url, [{"traceparent": traceparent(sampled=False)}] * BATCH))
    assert all(answer.status_code == 200 for answer in answers)
    assert adder.exporter.get_finished_spans() == ()


def test_the_latency_histogram_carries_trace_ids_as_exemplars(adder: Traced) -> None:
    adder.exporter.clear()
    asyncio.run(predict_together(adder.url, [{"traceparent": traceparent()}] * BATCH))
    adder.spans(BATCH + 1)
    metrics = httpx.get(
        f"{adder.url}/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert metrics.headers["content-type"].startswith("application/openmetrics-text")
    exemplars = [
        line
        for line in metrics.text.splitlines()
        if line.startswith("batchd_request_duration_seconds_bucket") and "#" in line
    ]
    # The latest recorded request of each bucket: this test's where its requests fell.
    assert any(f'trace_id="{CALLER_TRACE}"' in line for line in exemplars), exemplars
    # Prometheus' text format has no exemplars: a scraper that does not ask gets it as before.
    plain = httpx.get(f"{adder.url}/metrics")
    assert plain.headers["content-type"].startswith("text/plain")


def test_a_composed_call_carries_the_batch_context_to_the_callee() -> None:
    """A composer (an async handler calling another deployment through a handle) and its callee,
    each traced: one trace, the callee's request a child of the composer's call."""
    with (
        serve(manifest("callee", "batchd.testing.batch_handlers:add_one")) as callee,
        serve(
            manifest(
                "composer", {"handler": "batchd.testing.batch_handlers:Relay", "calls": {"adder": "callee"}}
            ),
            calls={"adder": callee.url},
        ) as caller,
    ):
        check_composed_trace(caller, callee)


def check_composed_trace(caller: Traced, callee: Traced) -> None:
    answer = httpx.post(
        f"{caller.url}/v1/models/composer:predict",
        json={"instances": [{"to": "adder", "n": 1}]},
        headers={"traceparent": traceparent()},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    caller_spans = caller.spans(3)  # request, batch, call
    callee_spans = callee.spans(2)  # request, batch
    (call,) = by_kind(caller_spans, SpanKind.CLIENT)
    (batch,) = by_kind(caller_spans, SpanKind.INTERNAL)
    (callee_request,) = by_kind(callee_spans, SpanKind.SERVER)
    assert call.parent is not None and call.parent.span_id == batch.context.span_id
    assert callee_request.parent is not None and callee_request.parent.span_id == call.context.span_id
    assert {format(span.context.trace_id, "032x") for span in [*caller_spans, *callee_spans]} == {
        CALLER_TRACE
    }


PROMPT = "The secret recipe of the house is"
TOKENS = 24  # per answer: long enough that requests sent together share a decoding run


@pytest.fixture(scope="module")
def gpt2_document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny GPT-2 on token-level scheduling, every answer exactly TOKENS long."""
    directory = build_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))
    model = {
        "task": "text-generation",
        "source": f"file://{directory}",
        "device": "cpu",
        "call_kwargs": {"max_new_tokens": TOKENS, "min_new_tokens": TOKENS},
        "generation": {"max_new_tokens": TOKENS},
    }
    return manifest("gpt2", model, batching={"max_batch_size": 4, "request_timeout_s": 60})


async def complete_together(url: str, count: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        answers = await asyncio.gather(
            *(
                client.post("/v1/completions", json={"model": "gpt2", "prompt": PROMPT, "max_tokens": TOKENS})
                for _ in range(count)
            )
        )
    assert [a.status_code for a in answers] == [200] * count, [a.text for a in answers]


def finished_requests(traced: Traced, count: int) -> tuple[list[ReadableSpan], list[ReadableSpan]]:
    """The requests' SERVER spans and the decoding runs' spans, once every request is linked."""

    def probe() -> tuple[list[ReadableSpan], list[ReadableSpan]] | None:
        spans = list(traced.exporter.get_finished_spans())
        requests, runs = by_kind(spans, SpanKind.SERVER), by_kind(spans, SpanKind.INTERNAL)
        linked = sum(len(run.links) for run in runs)
        return (requests, runs) if len(requests) == count and linked == count else None

    found = eventually(probe, what=f"{count} requests and the decoding runs linked to them")
    assert found is not None
    return found


async def test_a_decoding_run_is_linked_to_every_request_it_carried(gpt2_document: dict[str, Any]) -> None:
    with serve(gpt2_document) as traced:
        await complete_together(traced.url, 3)
        requests, runs = finished_requests(traced, 3)
    # Every request linked once, from the run it rode in, which is a child of its first request.
    links = [(link.context.trace_id, link.context.span_id) for run in runs for link in run.links]
    assert sorted(links) == sorted((r.context.trace_id, r.context.span_id) for r in requests)
    for run in runs:
        assert run.name == "decode gpt2"
        assert run.parent is not None and run.parent.span_id in {link.context.span_id for link in run.links}
        attributes = dict(run.attributes or {})
        assert attributes["batchd.batch.requests"] == len(run.links) == attributes["batchd.decode.sequences"]
        assert int(str(attributes["batchd.decode.prefills"])) >= 1
        assert int(str(attributes["batchd.decode.steps"])) >= TOKENS - 1
        assert float(str(attributes["batchd.batch.model_s"])) > 0
    for request in requests:  # the GenAI usage, and no text
        attributes = dict(request.attributes or {})
        assert attributes["gen_ai.usage.output_tokens"] == TOKENS
        assert not any(PROMPT in str(value) for value in attributes.values())
        assert "gen_ai.input.messages" not in attributes and "gen_ai.output.messages" not in attributes


async def test_prompt_text_is_in_spans_only_where_the_deployment_opted_in(
    gpt2_document: dict[str, Any],
) -> None:
    with serve(gpt2_document, config=TracingConfig(capture_prompts=True)) as traced:
        await complete_together(traced.url, 1)
        ((request,), _) = finished_requests(traced, 1)
    attributes = request.attributes or {}
    (message,) = json.loads(str(attributes["gen_ai.input.messages"]))
    assert message["parts"] == [{"type": "text", "content": PROMPT}]
    (answer,) = json.loads(str(attributes["gen_ai.output.messages"]))
    assert answer["finish_reason"] == "length" and answer["parts"][0]["content"]
