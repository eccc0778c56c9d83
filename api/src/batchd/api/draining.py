"""`DrainingServer`: uvicorn with the graceful stop that every batchd HTTP server (the replica, the
router) makes on SIGTERM, so that a rollout or a scale-down resets no client.

1. `begin_draining` (the server's own): it turns unready and answers with `Connection: close`
   from then on; the listener closes, so new connections go to another pod;
2. every open connection is kept, and what arrives on one is answered as usual, so each client
   learns to leave and none is cut off mid-request;
3. a connection is closed once it has sat idle for IDLE_CLOSE_S with nothing unread
   (`batchd.api.httpserver.close_idle`), until every one is gone and the server has nothing left
   (`drained`), or `drain_timeout_s` has passed (`at_drain_timeout` deals with what is left);
4. the process exits 0: a drained stop is a clean one.

Needs the `server` extra (`batchd-api[server]`): the operator never imports it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType
from typing import Any

import uvicorn

from batchd.api.httpserver import POLL_S, close_idle

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.drain_timeout_s = drain_timeout_s

    def begin_draining(self) -> None:
        """Turn unready and refuse new work; called once, on the first SIGTERM or SIGINT."""
        raise NotImplementedError

    def drains(self) -> bool:
        """Whether to wait for clients at all (a server whose start failed has none to wait for)."""
        return True

    def drained(self) -> bool:
        """Whether the server has nothing left to finish besides its open connections."""
        return True

    def at_drain_timeout(self) -> None:
        """What to do with what is left once `drain_timeout_s` has passed."""
        if self.server_state.connections:
            logger.warning(
                "%d connection(s) still open at the drain timeout", len(self.server_state.connections)
            )

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.begin_draining()
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM and sig in self._captured_signals:
            # uvicorn re-raises captured signals once it has stopped, so the process would die
            # of SIGTERM (143). A drained stop is a clean one: the kubelet should see exit 0.
            self._captured_signals.remove(sig)

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        for server in self.servers:
            server.close()  # new connections are refused from here on
        if not self.force_exit and self.drains():
            await self._drain()
        await super().shutdown(sockets)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout_s
        idle_since: dict[Any, float] = {}
        while loop.time() < deadline and not self.force_exit:
            if not self.server_state.connections and self.drained():
                return
            close_idle(self.server_state.connections, idle_since, loop.time())
            await asyncio.sleep(POLL_S)
        self.at_drain_timeout()
