"""The router's Prometheus metrics: base units, prefix `batchd_router_`, labelled by deployment.

Labels are the deployment's namespace and name (and, for the load the router sees, the replica's
address, one series per ready replica, removed when the replica goes). One registry per router,
so that tests can run several in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

DEPLOYMENT = ("namespace", "deployment")
# Holds last from milliseconds (a replica appears) to the hold timeout (a cold start of a model).
HOLD_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "batchd_router_requests",
            "Requests answered, by the class of the status code the client got.",
            [*DEPLOYMENT, "code"],
            registry=r,
        )
        self.decisions = Counter(
            "batchd_router_decisions",
            "Replicas picked: `prefix` (one holding the start of a generation request's prompt), "
            "`two_choices` (the less loaded of two), `only_choice` (one was left).",
            [*DEPLOYMENT, "choice"],
            registry=r,
        )
        self.prefix_routes = Counter(
            "batchd_router_prefix_routes",
            "Text-generation requests of deployments with a prefix cache, by how they were routed: "
            "`hit` (to a replica the router had sent the start of the prompt to), `imbalanced` (every "
            "such replica was busier than the load guard allows: by load), `miss` (none: by load).",
            [*DEPLOYMENT, "outcome"],
            registry=r,
        )
        self.revisions = Counter(
            "batchd_router_revision_requests",
            "Requests sent to each revision of a deployment while a canary takes a share of them: "
            "`canary` or `stable` (not counted when no rollout runs).",
            [*DEPLOYMENT, "track"],
            registry=r,
        )
        self.retries = Counter(
            "batchd_router_retries",
            "Requests sent again to another replica: `refused` (the replica said it did not accept it), "
            "`unreachable` (no connection could be opened, nothing was sent).",
            [*DEPLOYMENT, "reason"],
            registry=r,
        )
        self.held = Gauge(
            "batchd_router_held_requests",
            "Requests waiting for a first ready replica of their deployment.",
            DEPLOYMENT,
            registry=r,
        )
        self.hold_seconds = Histogram(
            "batchd_router_hold_seconds",
            "How long a request waited for a first ready replica, whatever the outcome.",
            DEPLOYMENT,
            buckets=HOLD_BUCKETS,
            registry=r,
        )
        self.holds = Counter(
            "batchd_router_holds",
            "How holds ended: `released` (a replica came), `timeout`, `full` (none held), `shed` (a "
            "sheddable class past its share, not held), `displaced` (a higher class took its place), "
            "`deleted`, `cancelled` (the client left or its deadline passed), `shutdown` (the router's "
            "drain ended).",
            [*DEPLOYMENT, "outcome"],
            registry=r,
        )
        self.cold_starts = Counter(
            "batchd_router_cold_starts",
            "Requests that waited for their deployment's first ready replica and then were sent to it.",
            DEPLOYMENT,
            registry=r,
        )
        self.replica_load = Gauge(
            "batchd_router_replica_load_items",
            "The items the router believes a replica holds: its own in flight plus others' at the last "
            "`GET /load`.",
            [*DEPLOYMENT, "replica"],
            registry=r,
        )
        self.refusals = Counter(
            "batchd_router_refusals",
            "Requests the router refused for who sent them or what they asked (401, 403, 429), by "
            "tenant (a declared name; `unknown` for a caller that is none) and reason.",
            [*DEPLOYMENT, "tenant", "code", "reason"],
            registry=r,
        )
        self.replicas = Gauge(
            "batchd_router_ready_replicas",
            "Ready replicas of a deployment, as the router's EndpointSlice watch sees them.",
            DEPLOYMENT,
            registry=r,
        )
