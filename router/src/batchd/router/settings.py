"""Router settings, read once at startup from `BATCHD_*` variables and flags, then passed down.

Nothing below reads the environment again, so a running router never changes behaviour because
a variable changed under it. A bad value stops the process at startup naming the variable.
"""

from __future__ import annotations

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from batchd.api.environment import ClusterClientSettings, LogLevel
from batchd.api.pod import ROUTER_ADMIN_PORT, ROUTER_PORT


class RouterSettings(ClusterClientSettings):
    """Everything the router can be told; each default says why it is what it is."""

    # Loopback by default: a router listening on a shared pod network is the chart's decision.
    host: str = "127.0.0.1"
    port: int = Field(default=ROUTER_PORT, ge=0, le=65535)
    # The port of `/metrics` and `GET /held` (the scraper's and the operator's), on the same host:
    # never the clients' port, so that a NetworkPolicy can let in the scraper and no client.
    admin_port: int = Field(default=ROUTER_ADMIN_PORT, ge=0, le=65535)
    # The router's own Service and namespace (the chart sets them, BATCHD_ROUTER_SERVICE and
    # BATCHD_ROUTER_NAMESPACE): each router enforces a tenant's quota divided by the ready endpoints
    # of that Service. Empty: this router alone (a router run by hand enforces the whole quota).
    router_service: str = ""
    router_namespace: str = ""
    log_level: LogLevel = "info"
    # On SIGTERM: how long requests in flight and held get to finish before held ones are refused
    # (503 + Retry-After) and the router exits (seconds). As long as a hold may last, so that a
    # rollout during a cold start loses nothing; the pod's terminationGracePeriodSeconds must be
    # longer (by the router's FINISH_S, 5 s, at least).
    drain_timeout_s: PositiveFloat = 30.0
    # Seconds a watch asks the API server to run before it ends and is opened again; the API server's
    # own default lies between 30 and 60 minutes, a shorter one spreads reconnects of many routers.
    watch_timeout_s: PositiveInt = 300
    # Seconds to wait before opening a watch again after it failed (API server away, 410 Gone).
    watch_retry_s: PositiveFloat = 1.0

    # Requests held per deployment while it has no ready replica (scale from zero); past it: 503.
    # Each held request is a connection and its body in memory, bounded here.
    max_held_per_deployment: NonNegativeInt = 256
    # Seconds a request is held waiting for a first replica before 503 + Retry-After. Long enough
    # for a small model to start on a warm node; a large one takes longer and its clients retry.
    hold_timeout_s: PositiveFloat = 30.0
    # The Retry-After (seconds) of a 503 for a request that could not be held or waited too long.
    hold_retry_after_s: PositiveInt = 5

    # Seconds between two reads of every replica's `GET /load`: the correction for load the router
    # did not send (other routers, direct clients); its own in-flight count is exact at all times.
    load_poll_interval_s: PositiveFloat = 0.5
    # Seconds one read may take; a replica that does not answer keeps its last reading.
    load_poll_timeout_s: PositiveFloat = 1.0

    # A request body up to this size is kept while it streams to a replica, so that a replica's
    # refusal (queue full, draining) can be retried on another; a larger one is not retried (bytes).
    retry_body_max_bytes: NonNegativeInt = 1024 * 1024
    # Keep-alive connections per replica, at most (0 = no bound): the replica queues, not the socket.
    upstream_connections_per_replica: NonNegativeInt = 512
    # Seconds an idle connection to a replica is kept; below the replica's 75 s so that the replica
    # never closes a connection the router is about to reuse.
    upstream_keepalive_s: PositiveFloat = 30.0
    # Seconds to open a connection to a replica; one that cannot be reached is tried no longer.
    upstream_connect_timeout_s: PositiveFloat = 2.0
    # Text generation: each request to the replica most likely to hold the beginning of its prompt
    # in its prefix cache (the router's own index of what it sent where), within the load guard
    # below; off: the better of two by load, as every other request.
    prefix_routing: bool = True
    # Characters of a prompt per chunk of the index, and the most chunks of one prompt matched:
    # the Gateway API Inference Extension's prefix plugin's defaults (64 characters are about 16
    # tokens, one block of a replica's cache; 256 chunks, the first 16 KiB of a prompt).
    prefix_chunk_chars: PositiveInt = 64
    prefix_max_chunks: PositiveInt = 256
    # Chunks remembered per replica, least recently used forgotten first: about what a replica's
    # cache holds of a small model's prompts (the extension's default), at 100 bytes each here.
    prefix_chunks_per_replica: PositiveInt = 31_250
    # The load guard (SGLang's balance thresholds): a replica is too busy to take a request for its
    # prefix when it holds more items than the least loaded replica by more than this share of
    # the deployment's max_batch_size (at least one item) and by more than this ratio; the request
    # then goes to the better of two by load, so a hot prefix spreads over the replicas.
    prefix_load_slack: NonNegativeFloat = 0.25
    prefix_load_ratio: PositiveFloat = 1.5

    # A replica's answer is waited for the deployment's `request_timeout_s` plus this (seconds),
    # then 504: the replica answers its own 504 at `request_timeout_s`, this is the time for that
    # answer to arrive, so a replica that hangs (or a partition) holds no client forever.
    answer_margin_s: PositiveFloat = 1.0
