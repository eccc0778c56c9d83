"""The benchmark's sizes, chosen to finish in about five minutes on two shared cores, and its goals."""

from __future__ import annotations

from dataclasses import dataclass

# The ways in, each measured every repeat: no credential (an open deployment), an API key, a token.
WAYS = ("off", "key", "token")
OFF = WAYS[0]

# The goals: router CPU per request added to access off's, in microseconds (judged on the decision's
# own cost, `decision`: the end-to-end rounds of one way spread wider than this); TokenReviews per token
# per review TTL (`batchd.router.token_reviews`).
ADDED_CPU_GOAL_US = 15.0
REVIEWS_PER_TTL_GOAL = 1
# Another tenant's cached prompt is answered no sooner than this share of a fresh one's time (the
# medians): within 10%, as the issue asks.
PROBE_GOAL = 0.9


@dataclass(frozen=True)
class Options:
    repeats: int = 5
    seconds: float = 5.0  # each measured closed loop
    warmup_s: float = 0.5  # before each, not counted
    in_flight: int = 16  # requests in flight while the router's CPU is read
    probe_tries: int = 20  # of the cache probe; 0: not run
    decision_iterations: int = 20000  # requests timed per way and round, in one process
    decision_rounds: int = 5
    probe_threads: int | None = None  # torch's threads in the probe's replica (None: its own choice)
    # The probe's replica starts once the rounds are over: none of its start runs beside them (the
    # smoke's does, on a machine of few cores).
    quiet_start: bool = True


# Smoke-sized: every way in, the reviews, the probe and the decision, each for a moment (the test
# checks what ran, not the figures). The probe's replica starts while the rounds run, on one torch
# thread: OpenMP's threads spin waiting for each other on shared cores, some 60% of its start's CPU.
QUICK = Options(
    repeats=1,
    seconds=0.3,
    warmup_s=0.1,
    in_flight=4,
    probe_tries=2,
    decision_iterations=2000,
    decision_rounds=1,
    probe_threads=1,
    quiet_start=False,
)
