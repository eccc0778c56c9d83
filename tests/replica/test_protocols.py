"""The three HTTP protocols and their errors, through a real uvicorn on loopback with custom handlers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from batchd.api.manifest import parse_manifest
from batchd.replica.front.app import create_app
from batchd.replica.front.server import replica_protocol
from batchd.replica.settings import ReplicaSettings
from batchd.testing.manifests import manifest
from batchd.testing.promtext import parse_counter, parse_histogram
from batchd.testing.servers import uvicorn_in_thread

# Each test runs on both of the replica's paths for a KServe V1 prediction: the direct path in
# the connection's protocol (`batchd.replica.front.direct`), and the ASGI front (`inference`) that
# answers it when the access log is on, and answers every other route.
PATHS = ("direct", "asgi")


@pytest.fixture(scope="module", params=PATHS)
def front(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def serve(document: dict[str, Any], front: str = "direct", **settings: Any) -> Iterator[str]:
    app = create_app(parse_manifest(document), ReplicaSettings(**settings))
    protocol = replica_protocol(app, access_log=front == "asgi")
    with uvicorn_in_thread(app, http=protocol) as url:
        yield url


@pytest.fixture(scope="module")
def adder(front: str) -> Iterator[str]:
    yield from serve(
        manifest(
            "adder",
            "batchd.testing.batch_handlers:add_one",
            batching={"max_batch_size": 8, "batch_wait_timeout_s": 0.005},
        ),
        front,
        max_body_bytes=4096,
    )


def test_kserve_v1_predicts_one_result_per_instance(adder: str) -> None:
    response = httpx.post(f"{adder}/v1/models/adder:predict", json={"instances": [1, 2, 3]})
    assert response.status_code == 200
    assert response.json() == {"predictions": [2, 3, 4]}


def test_open_inference_v2_infers_along_the_first_dimension(adder: str) -> None:
    body = {"id": "r1", "inputs": [{"name": "x", "shape": [3], "datatype": "INT64", "data": [10, 20, 30]}]}
    response = httpx.post(f"{adder}/v2/models/adder/infer", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model_name"] == "adder" and answer["id"] == "r1"
    (output,) = answer["outputs"]
    assert output["shape"] == [3] and output["datatype"] == "INT64" and output["data"] == [11, 21, 31]


def test_the_seeds_simple_call_coerces_the_query_to_the_handlers_item_type(adder: str) -> None:
    assert httpx.get(f"{adder}/", params={"number": "41"}).json() == 42
    assert httpx.post(f"{adder}/", params={"number": "1"}).json() == 2


def test_a_result_past_64_bits_is_answered_exactly(adder: str) -> None:
    # JSON has no bound on integers, and Python's clients read them exactly.
    beyond = -(2**63) - 2
    assert httpx.get(f"{adder}/", params={"number": str(beyond)}).json() == beyond + 1


@pytest.mark.parametrize("via", PATHS)
def test_a_result_that_is_no_json_is_an_error_answer_and_the_replica_serves_on(via: str) -> None:
    for url in serve(manifest("opaque", "batchd.testing.batch_handlers:not_json"), via):
        response = httpx.post(f"{url}/v1/models/opaque:predict", json={"instances": [1]})
        assert response.status_code == 500
        assert "not JSON" in response.json()["error"], response.text
        metrics = httpx.get(f"{url}/metrics").text
        assert parse_counter(metrics, "batchd_requests", {"outcome": "error"}) == 1
        assert parse_counter(metrics, "batchd_requests", {"outcome": "success"}) == 0


def test_health_and_metadata_routes(adder: str) -> None:
    assert httpx.get(f"{adder}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{adder}/v2/health/ready").json() == {"ready": True}
    assert httpx.get(f"{adder}/v2/models/adder/ready").status_code == 200
    assert httpx.get(f"{adder}/v1/models/adder").json().items() >= {"name": "adder", "ready": True}.items()
    metadata = httpx.get(f"{adder}/v2/models/adder").json()
    assert metadata["name"] == "adder" and metadata["inputs"] and metadata["outputs"]


@pytest.mark.parametrize(
    ("path", "content", "status", "message"),
    [
        ("/v1/models/adder:predict", b"{not json", 400, "not valid JSON"),
        ("/v1/models/adder:predict", b"", 400, "empty"),
        ("/v1/models/adder:predict", b'{"inputs": [1]}', 400, "instances: required"),
        ("/v1/models/adder:predict", b'{"instances": 3}', 400, "instances: expected a list"),
        ("/v1/models/adder:predict", b'{"instances": []}', 400, "instances: the batch is empty"),
        ("/v1/models/adder:predict", b'{"instances": [1, "abc"]}', 400, "instances[1]"),
        ("/v1/models/nope:predict", b'{"instances": [1]}', 404, "'nope' is not served here"),
        ("/v2/models/adder/infer", b'{"inputs": []}', 400, "inputs: expected a non-empty list"),
        (
            "/v2/models/adder/infer",
            b'{"inputs": [{"name": "x", "shape": [2], "datatype": "INT64", "data": [1]}]}',
            400,
            "inputs[0].data: shape [2] needs 2 element(s), got 1",
        ),
        (
            "/v2/models/adder/infer",
            b'{"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": ["a"]}]}',
            400,
            "inputs[0].data[0]: 'a' is not a valid INT64",
        ),
        (
            "/v2/models/adder/infer",
            b'{"inputs": [{"name": "x", "shape": [1], "datatype": "INT65", "data": [1]}]}',
            400,
            "inputs[0].datatype",
        ),
        ("/v1/models/adder:predict", b'{"instances": [' + b"1," * 3000 + b"1]}", 413, "request body"),
    ],
)
def test_bad_input_gets_a_4xx_that_names_the_problem(
    adder: str, path: str, content: bytes, status: int, message: str
) -> None:
    response = httpx.post(f"{adder}{path}", content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert message in response.json()["error"]
    # ... and the server is still up and serving.
    assert httpx.post(f"{adder}/v1/models/adder:predict", json={"instances": [1]}).json() == {
        "predictions": [2]
    }


def test_simple_call_without_a_query_is_refused(adder: str) -> None:
    response = httpx.get(f"{adder}/")
    assert response.status_code == 400 and "?text=" in response.json()["error"]


def test_metrics_count_batches_and_outcomes(adder: str) -> None:
    def counts() -> tuple[float, float, float, float]:
        text = httpx.get(f"{adder}/metrics").text
        return (
            parse_histogram(text, "batchd_batch_size").count,
            parse_histogram(text, "batchd_batch_size").sum,
            parse_counter(text, "batchd_requests", {"outcome": "success"}),
            parse_counter(text, "batchd_rejections", {"reason": "invalid"}),
        )

    before = counts()
    assert httpx.post(f"{adder}/v1/models/adder:predict", json={"instances": [1, 2]}).status_code == 200
    assert httpx.post(f"{adder}/v1/models/adder:predict", json={"instances": ["x"]}).status_code == 400
    after = counts()
    batches, items, successes, invalid = (a - b for a, b in zip(after, before, strict=True))
    assert (batches, items, successes, invalid) == (1, 2, 1, 1)


def slow_adder(name: str, front: str, **batching: Any) -> Iterator[str]:
    """A replica whose model holds every batch for 0.2 s: long enough to fill a queue or pass a deadline."""
    yield from serve(
        manifest(
            name, "batchd.testing.batch_handlers:SlowAdder", batching={"batch_wait_timeout_s": 0, **batching}
        ),
        front,
    )


@pytest.fixture(scope="module")
def slow(front: str) -> Iterator[str]:
    yield from slow_adder("slow", front, max_batch_size=2, max_queued_requests=4, request_timeout_s=5)


async def test_overload_answers_503_with_retry_after_and_the_server_stays_up(slow: str) -> None:
    async with httpx.AsyncClient(base_url=slow, timeout=30) as client:
        burst = [client.post("/v1/models/slow:predict", json={"instances": [n]}) for n in range(20)]
        responses = await asyncio.gather(*burst)
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) >= 4 and statuses.count(503) >= 1, statuses
    refused = next(r for r in responses if r.status_code == 503)
    assert int(refused.headers["retry-after"]) >= 1
    assert "queue full" in refused.json()["error"]
    for response in responses:
        if response.status_code == 200:  # every accepted request got its own answer
            assert response.json()["predictions"][0] >= 1
    assert httpx.post(f"{slow}/v1/models/slow:predict", json={"instances": [7]}).json() == {
        "predictions": [8]
    }
    metrics = httpx.get(f"{slow}/metrics").text
    assert parse_counter(metrics, "batchd_rejections", {"reason": "queue_full"}) == statuses.count(503)


@pytest.fixture(scope="module")
def sluggish(front: str) -> Iterator[str]:
    yield from slow_adder("sluggish", front, max_batch_size=1, request_timeout_s=0.3)


async def test_a_request_past_its_timeout_gets_504(sluggish: str) -> None:
    async with httpx.AsyncClient(base_url=sluggish, timeout=30) as client:
        responses = await asyncio.gather(
            *(client.post("/v1/models/sluggish:predict", json={"instances": [n]}) for n in range(4))
        )
    statuses = sorted(r.status_code for r in responses)
    assert 504 in statuses, statuses
    timed_out = next(r for r in responses if r.status_code == 504)
    assert "request_timeout_s" in timed_out.json()["error"]


async def test_a_request_past_its_clients_timeout_gets_504_naming_the_header(sluggish: str) -> None:
    # Each batch holds the model 0.2 s: longer than this client waits, shorter than request_timeout_s.
    async with httpx.AsyncClient(base_url=sluggish, timeout=30) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    "/v1/models/sluggish:predict",
                    json={"instances": [n]},
                    headers={"batchd-timeout-s": "0.1"},
                )
                for n in range(2)
            )
        )
    timed_out = [r for r in responses if r.status_code == 504]
    assert timed_out, [r.status_code for r in responses]
    assert "batchd-timeout-s passed" in timed_out[0].json()["error"]


@pytest.fixture(scope="module")
def failing(front: str) -> Iterator[str]:
    yield from serve(
        manifest(
            "failing",
            "batchd.testing.batch_handlers:Failing.handle",
            batching={"max_batch_size": 8, "batch_wait_timeout_s": 0.5},
        ),
        front,
    )


async def test_poisoned_items_of_a_full_batch_fail_alone_and_their_batch_mates_are_answered(
    failing: str,
) -> None:
    numbers = [3, -1, 5, 8, -7, 2, 9, 4]  # one full batch (max_batch_size 8), two poisoned items
    before = httpx.get(f"{failing}/metrics").text
    async with httpx.AsyncClient(base_url=failing, timeout=30) as client:
        answers = await asyncio.gather(
            *(client.post("/v1/models/failing:predict", json={"instances": [n]}) for n in numbers)
        )
    after = httpx.get(f"{failing}/metrics").text
    for number, answer in zip(numbers, answers, strict=True):
        if number < 0:
            assert answer.status_code == 422, answer.text  # the item's fault, and the answer says which
            assert (
                f"item {number} alone" in answer.json()["error"]
                and "negative input" in answer.json()["error"]
            )
        else:
            assert answer.json() == {"predictions": [number * 2]}
    sizes = parse_histogram(after, "batchd_batch_size").minus(parse_histogram(before, "batchd_batch_size"))
    assert (sizes.count, sizes.sum) == (1, 8)  # they really shared one batch
    isolated = parse_counter(after, "batchd_isolated_failures") - parse_counter(
        before, "batchd_isolated_failures"
    )
    assert isolated == 2


@pytest.fixture(scope="module")
def queued(front: str) -> Iterator[str]:
    yield from slow_adder("queued", front, max_batch_size=1, request_timeout_s=10)


async def test_a_client_that_disconnects_never_reaches_the_model(queued: str) -> None:
    def count(text: str, sample: str) -> float:
        line = next(line for line in text.splitlines() if line.startswith(sample))
        return float(line.rsplit(" ", 1)[1])

    batches = 'batchd_batch_size_count{deployment="queued",model="queued"}'
    cancelled = 'batchd_requests_total{deployment="queued",model="queued",outcome="cancelled"}'
    async with httpx.AsyncClient(base_url=queued, timeout=30) as client:
        before = (await client.get("/metrics")).text
        busy = asyncio.ensure_future(client.post("/v1/models/queued:predict", json={"instances": [1]}))
        # A second client gives up while its item waits behind the first (0.2 s in the model).
        async with httpx.AsyncClient(base_url=queued, timeout=0.05) as impatient:
            with pytest.raises(httpx.TimeoutException):
                await impatient.post("/v1/models/queued:predict", json={"instances": [2]})
        assert (await busy).json() == {"predictions": [2]}
        assert (await client.post("/v1/models/queued:predict", json={"instances": [3]})).json() == {
            "predictions": [4]
        }
        after = (await client.get("/metrics")).text
    assert count(after, batches) - count(before, batches) == 2  # the impatient item never ran
    assert count(after, cancelled) - count(before, cancelled) == 1
