"""`ReplicaServer`: uvicorn, with a graceful stop that resets no connection and waits for clients.

On SIGTERM uvicorn closes its listener and then closes every idle keep-alive connection at once.
A client may have written its next request on such a connection a moment before: the request
sits unread in the socket, the close discards it, and the kernel answers the client with a
reset. A pool of keep-alive clients (the way services talk to each other) meets that race on
nearly every rollout. So after SIGTERM a replica:

1. turns unready and refuses new work (`Replica.begin_draining`), and stops accepting
   connections: new ones are refused and go to another replica;
2. keeps every open connection, and answers every request that arrives on one, with
   `Connection: close` (503 with Retry-After for new work; accepted work completes), so each
   client learns to leave and none is cut off mid-request;
3. closes a connection itself only once it has sat idle for a second with nothing waiting
   unread in its socket, and waits for the others until `drain_timeout_s`;
4. then drains the batcher and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType
from typing import Any

import uvicorn

from batchd.api.httpserver import POLL_S, close_idle
from batchd.replica.replica import Replica

logger = logging.getLogger(__name__)


class ReplicaServer(uvicorn.Server):
    """uvicorn, plus: unready at once on SIGTERM, and a drain that lets every client finish."""

    def __init__(self, config: uvicorn.Config, replica: Replica, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.replica = replica
        self.drain_timeout_s = drain_timeout_s

    async def on_tick(self, counter: int) -> bool:
        # A model that failed to load ends the process: the pod restarts and says why.
        if self.replica.load_error is not None:
            return True
        return await super().on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.replica.begin_draining()
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM and sig in self._captured_signals:
            # uvicorn re-raises captured signals once it has stopped, so the process would die
            # of SIGTERM (143). A drained stop is a clean one: the kubelet should see exit 0.
            self._captured_signals.remove(sig)

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        for server in self.servers:
            server.close()  # new connections are refused from here on
        if not self.force_exit and self.replica.load_error is None:
            await self._let_clients_go()
        await super().shutdown(sockets)

    async def _let_clients_go(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout_s
        idle_since: dict[Any, float] = {}
        while self.server_state.connections and loop.time() < deadline and not self.force_exit:
            close_idle(self.server_state.connections, idle_since, loop.time())
            await asyncio.sleep(POLL_S)
        if self.server_state.connections:
            logger.warning(
                "%d connection(s) still open at the drain timeout", len(self.server_state.connections)
            )
