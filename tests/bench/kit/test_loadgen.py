"""The load generator drives any HTTP endpoint: here the bare ASGI floor, in uvicorn on loopback."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from batchd.bench.kit import connections, floor, loadgen, procstat
from batchd.testing.servers import uvicorn_in_thread


@pytest.fixture(scope="module")
def endpoint() -> Iterator[tuple[str, int]]:
    with uvicorn_in_thread(floor.app, wait_ready=False) as url:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        yield parts.hostname, parts.port


async def test_a_closed_loop_counts_every_answer_in_its_window(endpoint: tuple[str, int]) -> None:
    host, port = endpoint
    request = loadgen.Request.post_json(host, port, "/v1/models/floor:predict", b'{"instances": [1]}')
    result = await loadgen.closed_loop(host, port, request, concurrency=4, duration_s=0.5, warmup_s=0.1)
    assert result.errors == 0 and result.completed > 0
    assert result.throughput_rps == result.completed / 0.5
    assert all(latency > 0 for latency in result.latencies_s)


async def test_staggered_clients_call_back_when_the_window_opens_and_answers_resolve_finer_than_rounds(
    endpoint: tuple[str, int],
) -> None:
    host, port = endpoint
    request = loadgen.Request.post_json(host, port, "/v1/models/floor:predict", b'{"instances": [1]}')
    opened: list[float] = []
    result = await loadgen.closed_loop(
        host,
        port,
        request,
        4,
        duration_s=0.3,
        warmup_s=0.2,
        stagger_s=0.2,
        at_window=lambda: opened.append(1),
    )
    assert opened == [1] and result.errors == 0
    assert len(result.answered_s) == result.completed and all(0 <= at <= 0.3 for at in result.answered_s)
    assert sorted(set(result.answered_by)) == [0, 1, 2, 3] and result.steady_rps > 0


def test_answers_in_rounds_count_a_round_by_its_time_not_by_the_window() -> None:
    # Four clients answered together every 0.3 s, four rounds in a window of 1 s: 4 / 0.3 a second.
    result = loadgen.RunResult("closed", 4, None, duration_s=1.0)
    for round_ in range(4):
        for client in range(4):
            result.latencies_s.append(0.3)
            result.answered_s.append(0.05 + 0.3 * round_)
            result.answered_by.append(client)
    assert result.throughput_rps == 16.0  # a round more or less moves this by a quarter
    assert result.steady_rps == pytest.approx(4 / 0.3)  # 15 answers over 0.9 s would say 16.7
    # Staggered clients: the same rate, each client's answers a third of a round apart from the next's.
    spread = loadgen.RunResult("closed", 4, None, duration_s=1.0)
    for client in range(4):
        for round_ in range(3):
            spread.latencies_s.append(0.3)
            spread.answered_s.append(0.05 + 0.075 * client + 0.3 * round_)
            spread.answered_by.append(client)
    assert spread.steady_rps == pytest.approx(4 / 0.3)


async def test_an_open_loop_sends_every_request_when_due_and_counts_the_measured_part(
    endpoint: tuple[str, int],
) -> None:
    host, port = endpoint
    request = loadgen.Request.post_json(host, port, "/v1/models/floor:predict", b'{"instances": [1]}')
    steady = await loadgen.scheduled_loop(host, port, request, [i / 200 for i in range(100)], measured_s=0.5)
    assert (steady.offered, steady.completed, steady.errors) == (100, 100, 0)
    assert steady.duration_s >= 0.5

    dues = [0.01 * index for index in range(50)]  # the first 20 warm up
    warmed = await loadgen.scheduled_loop(host, port, request, dues, measure_from_s=0.2, measured_s=0.3)
    assert (warmed.offered, warmed.completed, warmed.errors) == (30, 30, 0)


async def test_a_refused_connection_is_an_error_not_a_latency() -> None:
    request = loadgen.Request.get("127.0.0.1", 9, "/")  # the discard port: nothing listens here
    result = await loadgen.scheduled_loop(
        "127.0.0.1", 9, request, [i / 20 for i in range(5)], measured_s=0.25
    )
    assert result.completed == 0 and result.errors == 5
    assert result.error_samples and "Error" in result.error_samples[0]


async def test_pollers_and_samplers_keep_a_series_while_a_load_runs(endpoint: tuple[str, int]) -> None:
    host, port = endpoint
    request = loadgen.Request.post_json(host, port, "/v1/models/floor:predict", b'{"instances": [1]}')
    async with (
        loadgen.Poller(host, port, "/metrics", every_s=0.05) as poller,
        procstat.Sampler(os.getpid(), every_s=0.05) as sampler,
    ):
        await loadgen.scheduled_loop(host, port, request, [i / 100 for i in range(30)], measured_s=0.3)
    for series in (poller.samples, sampler.samples):
        times = [at for at, _ in series]
        assert len(times) >= 2 and times == sorted(times)  # one on entry, one more on leaving at least
    assert [body for _, body in poller.samples] == [floor.ANSWER] * len(poller.samples)
    assert all(taken.rss_bytes > 0 and taken.cpu_s > 0 for _, taken in sampler.samples)


def test_an_answer_that_closes_the_connection_is_read_as_such() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nConnection: close\r\n\r\n"
    assert connections.parse_head(head) == (200, 2, False, True)
    assert connections.parse_head(b"HTTP/1.1 503 x\r\ncontent-length: 0\r\n\r\n") == (503, 0, False, False)


async def test_a_session_opens_a_new_connection_after_the_server_said_close() -> None:
    """A replica ends keep-alive connections after a bounded age or count, saying so on the last
    answer: the load generator must not send on a connection the server is closing."""
    opened = 0

    async def one_answer_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal opened
        opened += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(one_answer_per_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    session = connections.Session("127.0.0.1", port)
    try:
        answers = [await session.send(connections.Request.get("127.0.0.1", port, "/")) for _ in range(3)]
    finally:
        session.close()
        server.close()
        await server.wait_closed()
    assert answers == [(200, b"ok")] * 3 and opened == 3
