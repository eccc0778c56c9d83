"""What router.json holds, as frozen dataclasses (read back with `kit.records.from_json`): every
run of every part, so that the report can be made again from the file."""

from __future__ import annotations

from dataclasses import dataclass

from batchd.bench.kit.records import RunRecord


@dataclass(frozen=True)
class StepRun:
    """One path through the keep-alive step (1 -> `replicas` replicas while the load runs)."""

    path: str  # "service" (connections balanced) | "router"
    repeat: int
    requests: int
    statuses: dict[str, int]  # by HTTP status; "None" for no answer within the client's timeout
    unanswered: int  # neither a 2xx nor a 503/429 with Retry-After
    p99_ms: float  # of the 200s
    shares: list[float]  # each replica's share of the answers over the whole run
    settle_s: list[float | None]  # each added replica: from ready to its share (None: never)
    series: dict[str, list[float]]  # "t" and "r0".."rN": each replica's share per window


@dataclass(frozen=True)
class SteadyRun:
    """Open loop at a fixed utilisation of the replicas behind one path."""

    subject: str  # "one replica" (direct) | "service" | "router"
    repeat: int
    replicas: int
    rate_rps: float
    requests: int
    ok: int
    refused_503: int
    unanswered: int
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True)
class CostRound:
    """One round of the trivial adder, direct then through the router (or the other way round)."""

    repeat: int
    direct_p50_ms: float
    router_p50_ms: float
    direct_p99_ms: float
    router_p99_ms: float
    direct_rps: float  # with `in_flight` requests in flight
    router_rps: float
    router_cpu_us: float  # the router process's CPU per request, from /proc


@dataclass(frozen=True)
class ZeroRun:
    """One cold start: a deployment at zero replicas gets traffic; the router holds it."""

    repeat: int
    requests: int
    ok: int
    lost: int  # not answered 200 though sent within the hold bound
    load_s: float  # the replica's own start: process started -> ready
    first_answer_s: float  # the first request: sent -> answered
    noticed_s: float  # first request sent -> the stand-in saw it held
    ready_s: float  # first request sent -> the replica ready
    released_s: float  # replica's slice published -> first answer
    peak_held: int
    series: dict[str, list[float]]  # "t", "held", "answered" (per sample)


@dataclass(frozen=True)
class ClientRound:
    """One client's CPU per request towards the trivial adder, at one number in flight."""

    repeat: int
    client: str  # "aiohttp" | "httptools protocol"
    in_flight: int
    cpu_us: float


@dataclass(frozen=True)
class BoundRound:
    """One closed-loop run against one replica setup of the keep-alive bound."""

    repeat: int
    setup: str  # "no bound" | "defaults (...)" | "tight (...)"
    rps: float
    errors: int
    connections_opened: int  # by the clients, warm-up included


@dataclass(frozen=True)
class Part:
    """What every part's result starts with: its run and the options it ran with."""

    meta: RunRecord
    options: dict[str, float]


@dataclass(frozen=True)
class KeepaliveResult(Part):
    step: list[StepRun]
    steady: list[SteadyRun]


@dataclass(frozen=True)
class CostResult(Part):
    rounds: list[CostRound]


@dataclass(frozen=True)
class ZeroResult(Part):
    runs: list[ZeroRun]


@dataclass(frozen=True)
class ClientsResult(Part):
    rounds: list[ClientRound]


@dataclass(frozen=True)
class BoundResult(Part):
    rounds: list[BoundRound]


@dataclass(frozen=True)
class Results:
    """router.json: the parts run separately (or together) and report together."""

    keepalive: KeepaliveResult | None = None
    cost: CostResult | None = None
    zero: ZeroResult | None = None
    clients: ClientsResult | None = None
    bound: BoundResult | None = None
