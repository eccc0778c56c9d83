"""`ReplicaServer`: the replica's graceful stop (`batchd.api.draining`). On SIGTERM the replica turns
unready and refuses new work with 503 + Retry-After and `Connection: close` (`Replica.begin_draining`)
while accepted work completes; once its clients have left, the lifespan drains the batcher and
the process exits 0. A model that failed to load ends the process at once, with nothing to drain.
"""

from __future__ import annotations

import uvicorn

from batchd.api.draining import DrainingServer
from batchd.replica.front.asgi import InferenceRoutes
from batchd.replica.front.direct import direct_protocol
from batchd.replica.front.keepalive import BoundedHttpToolsProtocol, bounded_protocol
from batchd.replica.replica import Replica


def replica_protocol(app: InferenceRoutes, *, access_log: bool = False) -> type[BoundedHttpToolsProtocol]:
    """The connection protocol a replica's uvicorn runs: httptools with the keep-alive bounds
    (`keepalive`) and, unless every request is to be logged, the direct path (`direct`); the
    access log is written by uvicorn's cycle, which a direct request does not have."""
    settings = app.replica.settings
    protocol = bounded_protocol(settings.keepalive_max_requests, settings.keepalive_max_age_s)
    return protocol if access_log else direct_protocol(protocol, app.pipeline)


class ReplicaServer(DrainingServer):
    """uvicorn, plus: unready at once on SIGTERM, and a drain that lets every client finish."""

    def __init__(self, config: uvicorn.Config, replica: Replica, drain_timeout_s: float) -> None:
        super().__init__(config, drain_timeout_s)
        self.replica = replica

    async def on_tick(self, counter: int) -> bool:
        # A model that failed to load ends the process: the pod restarts and says why.
        if self.replica.load_error is not None:
            return True
        return await super().on_tick(counter)

    def begin_draining(self) -> None:
        self.replica.begin_draining()

    def drains(self) -> bool:
        return self.replica.load_error is None
