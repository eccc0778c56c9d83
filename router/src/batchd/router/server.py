"""`RouterServer`: uvicorn, with a drain on SIGTERM that loses no accepted request.

A rollout or a scale-down stops routers while clients hold keep-alive connections to them and
requests are in flight or held for a first replica. On SIGTERM the router:

1. turns unready at once (`/readyz` 503), so the endpoints stop sending it new connections, and
   closes its listener: new connections go to another router;
2. keeps every open connection, and routes what arrives on one as usual, with
   `Connection: close` on the answer, so each client learns to leave and none is cut off
   mid-request (a request written on an idle connection as it closed would be reset);
3. closes a connection itself once it has sat idle for IDLE_CLOSE_S with nothing unread;
4. once nothing is in flight or held and every connection is gone, or `drain_timeout_s` has
   passed, answers what is still held with 503 + Retry-After (and `Connection: close`), gives
   uvicorn FINISH_S to write what is being answered, and exits 0.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import signal
import struct
import termios
from types import FrameType
from typing import Any

import uvicorn

from batchd.router.holding import Holds
from batchd.router.proxy import Router

logger = logging.getLogger(__name__)

# A connection idle this long after SIGTERM is closed by the router (its client has had time to
# send and to be told to leave); one a client keeps using closes itself after its next answer.
IDLE_CLOSE_S = 1.0
POLL_S = 0.05
# After the drain: how long uvicorn waits for answers being written before it cancels them.
FINISH_S = 5


class RouterServer(uvicorn.Server):
    """uvicorn, plus: unready at once on SIGTERM, and a drain bounded by `drain_timeout_s`."""

    def __init__(self, config: uvicorn.Config, router: Router, holds: Holds, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.router = router
        self.holds = holds
        self.drain_timeout_s = drain_timeout_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.router.begin_draining()
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM and sig in self._captured_signals:
            # uvicorn re-raises captured signals once it has stopped, so the process would die
            # of SIGTERM (143). A drained stop is a clean one: the kubelet should see exit 0.
            self._captured_signals.remove(sig)

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        for server in self.servers:
            server.close()  # new connections are refused from here on
        if not self.force_exit:
            await self._drain()
        await super().shutdown(sockets)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout_s
        idle_since: dict[Any, float] = {}
        while loop.time() < deadline and not self.force_exit:
            if not self.server_state.connections and not self.router.inflight:
                return
            now = loop.time()
            for connection in list(self.server_state.connections):
                if not _idle(connection):
                    idle_since.pop(connection, None)
                elif now - idle_since.setdefault(connection, now) >= IDLE_CLOSE_S and not _unread(connection):
                    connection.transport.close()
            await asyncio.sleep(POLL_S)
        if self.holds.count:
            logger.warning("%d held request(s) refused at the drain timeout", self.holds.count)
            self.holds.refuse_all("the router is shutting down and no replica became ready; retry")
        if self.router.inflight:
            logger.warning("%d request(s) still in flight at the drain timeout", self.router.inflight)


def _idle(connection: Any) -> bool:
    """No request in progress on this uvicorn connection (between two keep-alive requests)."""
    cycle = getattr(connection, "cycle", None)
    return cycle is None or bool(cycle.response_complete)


def _unread(connection: Any) -> int:
    """Bytes the client sent that the server has not read yet: a request on its way in."""
    sock = connection.transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        pending = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int(struct.unpack("i", pending)[0])
