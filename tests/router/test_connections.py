"""The router's pool of keep-alive connections to replicas: a connection a replica closed is not
reused, even before the router's event loop has read the close."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from batchd.router.connections import Connection, Pool

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
REQUEST = b"GET /load HTTP/1.1\r\nhost: replica\r\n\r\n"


class BlockingReplica:
    """Answers every request on a connection with ANSWER, in a thread of its own, until `hang_up`
    closes every connection it accepted (as a killed process's kernel does)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.accepted.append(connection)
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        try:
            while connection.recv(65536):
                connection.sendall(ANSWER)
        except OSError:
            pass

    def hang_up(self) -> None:
        while self.accepted:
            connection = self.accepted.pop()
            connection.shutdown(socket.SHUT_RDWR)  # the FIN now, though a thread waits in recv
            connection.close()

    def close(self) -> None:
        self.hang_up()
        self.listener.close()


@pytest.fixture
def replica() -> Iterator[BlockingReplica]:
    server = BlockingReplica()
    yield server
    server.close()


async def answer_once(pool: Pool, address: str) -> Connection:
    connection = await pool.acquire(address)
    await connection.exchange(REQUEST, b"", chunked=False)
    assert connection.status == 200
    assert b"".join([chunk async for chunk in connection.body()]) == b"ok"
    pool.release(address, connection)
    return connection


async def test_an_idle_connection_is_reused(replica: BlockingReplica) -> None:
    pool = Pool(limit=0, keepalive_s=60, connect_timeout_s=5)
    first = await answer_once(pool, replica.address)
    assert not first.dropped()
    assert await answer_once(pool, replica.address) is first
    pool.close()


async def test_a_connection_the_replica_closed_is_not_reused_before_the_loop_reads_the_close(
    replica: BlockingReplica,
) -> None:
    pool = Pool(limit=0, keepalive_s=60, connect_timeout_s=5)
    first = await answer_once(pool, replica.address)
    replica.hang_up()
    # Until the next await the event loop cannot run, so the router has not read the close yet:
    # the pool must find out from the socket itself. Bounded wait for the kernel to deliver it.
    deadline = time.monotonic() + 5
    while not first.dropped() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not first.closed
    assert first.dropped()
    second = await answer_once(pool, replica.address)
    assert second is not first
    pool.close()
