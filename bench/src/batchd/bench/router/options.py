"""The sizes of each part, chosen to finish in a few minutes on two shared cores, and the goals."""

from __future__ import annotations

from dataclasses import dataclass

from batchd.operator.settings import Settings as OperatorSettings

# The slow adder: every batch of up to 8 holds the model 50 ms, so one replica serves at most
# 160 items a second whatever the machine's CPU does (a GPU's fixed cost per batch).
BATCH_S = 0.05
MAX_BATCH = 8
REPLICA_CAPACITY_RPS = MAX_BATCH / BATCH_S
SLOW_MODEL = "slow"
SLOW_PATH = f"/v1/models/{SLOW_MODEL}:predict"


@dataclass(frozen=True)
class KeepaliveOptions:
    repeats: int = 3
    replicas: int = 4
    rate_rps: float = 400.0  # the measured problem's load: 2.5x one replica, 62% of four
    connections: int = 32  # the client's keep-alive pool
    step_s: float = 12.0
    scale_at_s: float = 2.0  # the three other replicas become ready (endpoints) then
    window_s: float = 1.0  # shares are counted over this window
    sample_s: float = 0.25
    utilisation: float = 0.8  # of total capacity, for the steady runs (503s and p99)
    steady_s: float = 8.0
    warmup_s: float = 2.0  # of a steady run, not counted
    timeout_s: float = 30.0  # the client's: past it, a request is unanswered


@dataclass(frozen=True)
class CostOptions:
    repeats: int = 5
    seconds: float = 3.0  # each measurement
    in_flight: int = 32


# While a deployment is at zero replicas the operator reads the routers' `GET /held` this often
# (BATCHD_WAKE_POLL_INTERVAL_S): its own default, read from its settings.
OPERATOR_POLL_S: float = OperatorSettings.model_fields["wake_poll_interval_s"].default


@dataclass(frozen=True)
class ZeroOptions:
    repeats: int = 3
    rate_rps: float = 20.0
    seconds: float = 12.0
    # The stand-in for the operator reads the router's GET /held this often.
    poll_s: float = OPERATOR_POLL_S
    # How often a replica's readiness is probed once started, as a kubelet readiness probe would.
    probe_s: float = 0.2
    sample_s: float = 0.1
    hold_timeout_s: float = 30.0  # the router's default hold bound
    max_held: int = 256


PARTS = ("keepalive", "cost", "zero")


@dataclass(frozen=True)
class Options:
    """Every part's sizes; `repeats` and `poll_s`, when given, replace the parts' own."""

    repeats: int | None = None
    poll_s: float | None = None  # zero: how often the stand-in for the operator reads GET /held
    keepalive: KeepaliveOptions = KeepaliveOptions()
    cost: CostOptions = CostOptions()
    zero: ZeroOptions = ZeroOptions()


# Smoke-sized: every part for a moment (the test checks what ran, not the figures). The cold start's
# load stops sending before the replica is up: what it sent is held until then, and answered.
QUICK = Options(
    keepalive=KeepaliveOptions(repeats=1, step_s=6.0, steady_s=4.0, warmup_s=1.0),
    cost=CostOptions(repeats=1, seconds=0.3),
    zero=ZeroOptions(repeats=1, seconds=1.0, poll_s=0.5),
)

# The goals, checked and reported (a run that misses one still writes its figures).
SETTLE_GOAL_S = 5.0
REFUSED_GOAL = 0.01
P99_GOAL_RATIO = 1.5
ADDED_P50_GOAL_MS = 1.0
PER_CORE_GOAL_RPS = 5000.0
COLD_START_MARGIN_S = 2.0
