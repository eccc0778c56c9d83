"""The benchmark's sizes, chosen to finish in about ten minutes on two shared cores, and its goals."""

from __future__ import annotations

from dataclasses import dataclass

# The settings, each its own router and replicas: the sampling ratio (None: tracing off).
SAMPLING: dict[str, float | None] = {"off": None, "100%": 1.0, "1%": 0.01}
MODES = tuple(SAMPLING)
MODELS = ("adder", "minilm")

# The goals: requests per second of each sampling ratio, as a share of tracing off's.
RPS_GOALS = {"100%": 0.95, "1%": 0.99}


@dataclass(frozen=True)
class Options:
    models: tuple[str, ...] = MODELS
    repeats: int = 5
    seconds: float = 5.0  # each measured closed loop
    warmup_s: float = 1.0  # before each, not counted
    adder_clients: int = 32  # requests in flight: a full batch of the default max_batch_size
    minilm_clients: int = 32
    span_requests: int = 5000  # `spans`: requests timed, each way, per round
    span_rounds: int = 3


# Smoke-sized: every setting, the read-back and the span costs, each for a moment (the test checks
# what ran, not the figures). Half a second at 1% still sends a thousand requests or more, of which
# Jaeger should store some and not all.
QUICK = Options(models=("adder",), repeats=1, seconds=0.5, warmup_s=0.3, span_requests=500, span_rounds=1)
