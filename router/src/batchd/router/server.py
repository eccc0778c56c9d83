"""`RouterServer`: the router's graceful stop (`batchd.api.draining`), which loses no accepted request.

On SIGTERM the router turns unready (`/readyz` 503) and routes what still arrives on open
connections as usual, with `Connection: close`. It waits until nothing is in flight or held and
every connection is gone, or `drain_timeout_s` has passed: then it answers what is still held with
503 + Retry-After, gives uvicorn FINISH_S to write what is being answered, and exits 0.
"""

from __future__ import annotations

import logging

import uvicorn

from batchd.api.draining import DrainingServer
from batchd.router.proxy import Proxy

logger = logging.getLogger(__name__)

# After the drain: how long uvicorn waits for answers being written before it cancels them.
FINISH_S = 5


class RouterServer(DrainingServer):
    """uvicorn, plus: unready at once on SIGTERM, and a drain bounded by `drain_timeout_s`."""

    def __init__(self, config: uvicorn.Config, proxy: Proxy, drain_timeout_s: float) -> None:
        super().__init__(config, drain_timeout_s)
        self.proxy = proxy
        self.holds = proxy.holds

    def begin_draining(self) -> None:
        self.proxy.begin_draining()

    def drained(self) -> bool:
        return not self.proxy.inflight

    def at_drain_timeout(self) -> None:
        if self.holds.count:
            logger.warning("%d held request(s) refused at the drain timeout", self.holds.count)
            self.holds.refuse_all("the router is shutting down and no replica became ready; retry")
        if self.proxy.inflight:
            logger.warning("%d request(s) still in flight at the drain timeout", self.proxy.inflight)
