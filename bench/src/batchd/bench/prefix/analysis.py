"""Turning outcomes into figures: per run, medians over repeats, ratios within each repeat, goals.

Pure: what a report prints can be checked without a server.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from batchd.bench.kit.goals import Goal, median_at_least
from batchd.bench.kit.peer_servers.results import Results as PeerResults
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import median_over_repeats
from batchd.bench.kit.stats import percentile, ratio
from batchd.bench.prefix.client import Outcome


@dataclass(frozen=True)
class Figures:
    """One subject's run of one load: completions and tokens a second, time to first token, and
    the share of prompt tokens the replicas found cached."""

    requests: int
    completed: int
    errors: int
    error_samples: list[str]
    rps: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    hit_rate: float
    # Of conversations: the hit rate had every turn gone to the replica that served the one before
    # (and nothing been evicted): the most any routing could reach on this load.
    reachable_hit_rate: float = math.nan
    # Through a prefix-aware router: how it routed the run's requests, by its own count (its
    # `batchd_router_prefix_routes_total`: hit, imbalanced, miss).
    routes: dict[str, int] = field(default_factory=dict)


def _ttft_ms(outcomes: Sequence[Outcome], q: float) -> float:
    return percentile([o.first_s - o.due_s for o in outcomes if o.first_s is not None], q) * 1000


def figures(
    outcomes: Sequence[Outcome], since_s: float = 0.0, until_s: float = math.inf, turn_from: int = 0
) -> Figures:
    """The figures of the requests answered within [since_s, until_s] (of turn `turn_from` or later).

    Completions a second: a closed loop's are each client's own rate summed (its answers after
    its first over the time from its first to its last), which resolves finer than a count over
    the window where answers come in rounds, and counts each round once. An open loop's are
    counted from the first answer of the window to its last. Tokens a second likewise."""
    counted = [o for o in outcomes if o.turn >= turn_from]
    answered = sorted(
        (o for o in counted if o.ok and since_s <= (o.done_s or 0) <= until_s), key=lambda o: o.done_s or 0
    )
    failed = [o for o in counted if not o.ok and since_s <= o.due_s <= until_s]
    prompt = sum(o.prompt_tokens for o in answered)
    rps, tokens_per_s = _rates(answered, until_s - since_s)
    return Figures(
        requests=len(answered) + len(failed),
        completed=len(answered),
        errors=len(failed),
        error_samples=[o.error or "" for o in failed][:3],
        rps=rps,
        tokens_per_s=tokens_per_s,
        ttft_p50_ms=_ttft_ms(answered, 50),
        ttft_p90_ms=_ttft_ms(answered, 90),
        ttft_p99_ms=_ttft_ms(answered, 99),
        hit_rate=ratio(sum(o.cached_tokens for o in answered), prompt) if prompt else math.nan,
        reachable_hit_rate=ratio(sum(o.reusable_tokens for o in answered), prompt) if prompt else math.nan,
    )


def _rates(answered: Sequence[Outcome], window_s: float) -> tuple[float, float]:
    """Completions and new tokens a second of answers sorted by when they came (see `figures`)."""
    by_client: dict[int, list[Outcome]] = {}
    for outcome in answered:
        by_client.setdefault(outcome.client, []).append(outcome)
    groups = list(by_client.values()) if -1 not in by_client else [list(answered)]
    rps = tokens = 0.0
    spanned = False
    for group in groups:
        span = (group[-1].done_s or 0) - (group[0].done_s or 0)
        if len(group) > 1 and span > 0:
            rps += (len(group) - 1) / span
            tokens += sum(o.new_tokens for o in group[1:]) / span
            spanned = True
        elif math.isfinite(window_s) and window_s > 0:
            rps += len(group) / window_s
            tokens += sum(o.new_tokens for o in group) / window_s
    if spanned:
        return rps, tokens
    # No client answered twice in the window (requests as long as half of it): the count over it.
    if math.isfinite(window_s) and window_s > 0 and answered:
        return len(answered) / window_s, sum(o.new_tokens for o in answered) / window_s
    return math.nan, math.nan


# A load's runs: by load (a workload at some rate), then by subject, one figure per repeat.
Runs = dict[str, dict[str, list[Figures]]]


def per_repeat(
    runs: Runs, load: str, numerator: str, denominator: str, figure: Callable[[Figures], float]
) -> list[float]:
    """figure(numerator) / figure(denominator), repeat by repeat."""
    pairs = zip(runs.get(load, {}).get(numerator, []), runs.get(load, {}).get(denominator, []), strict=False)
    return [ratio(figure(a), figure(b)) for a, b in pairs]


# The replica part's loads and subjects.
CACHED, UNCACHED = "cache on", "cache off"
SYSTEM_CAPACITY = "system prompts, closed loop"
SYSTEM_LATENCY = "system prompts, open loop"
CONVERSATION_TURNS = "conversations"
UNIQUE_CAPACITY = "unique prompts, closed loop"
HOT_CAPACITY = "one hot prefix, closed loop"
# The routing part's.
PREFIX, TWO_CHOICES = "prefix-aware", "power of two"
ROUTED_CAPACITY = "conversations, closed loop"
ROUTED_CONVERSATIONS = "conversations, open loop"
ROUTED_HOT = "one hot prefix, closed loop"
ROUTED_UNIQUE = "unique prompts, closed loop"


def replica_goals(runs: Runs) -> list[Goal]:
    """The replica part's goals: the cache on against off, each the least ratio that meets it."""
    return [
        median_at_least(
            "system prompts: time to first token p50, off / on",
            per_repeat(runs, SYSTEM_LATENCY, UNCACHED, CACHED, lambda f: f.ttft_p50_ms),
            4.0,
        ),
        median_at_least(
            "system prompts: capacity, on / off",
            per_repeat(runs, SYSTEM_CAPACITY, CACHED, UNCACHED, lambda f: f.rps),
            2.0,
        ),
        median_at_least(
            "conversations: time to first token p50 from the third turn, off / on",
            per_repeat(runs, CONVERSATION_TURNS, UNCACHED, CACHED, lambda f: f.ttft_p50_ms),
            3.0,
        ),
        median_at_least(
            "unique prompts: capacity, on / off",
            per_repeat(runs, UNIQUE_CAPACITY, CACHED, UNCACHED, lambda f: f.rps),
            0.97,
        ),
    ]


def routing_goals(runs: Runs) -> list[Goal]:
    return [
        median_at_least(
            "conversations at 70% of power-of-two capacity: hit rate, prefix-aware / power of two",
            per_repeat(runs, ROUTED_CONVERSATIONS, PREFIX, TWO_CHOICES, lambda f: f.hit_rate),
            2.0,
        ),
        # Not met means that no router could meet the goal above on this load.
        median_at_least(
            "conversations at 70%: the most that ratio could be (every turn to the replica of the "
            "turn before: reachable hit rate / power of two's)",
            hit_rate_bound(runs),
            2.0,
        ),
        median_at_least(
            "conversations at 70%: time to first token p90, power of two / prefix-aware",
            per_repeat(runs, ROUTED_CONVERSATIONS, TWO_CHOICES, PREFIX, lambda f: f.ttft_p90_ms),
            2.0,
        ),
        median_at_least(
            "one hot prefix: throughput, prefix-aware / power of two",
            per_repeat(runs, ROUTED_HOT, PREFIX, TWO_CHOICES, lambda f: f.rps),
            0.95,
        ),
        median_at_least(
            "unique prompts: throughput, prefix-aware / power of two",
            per_repeat(runs, ROUTED_UNIQUE, PREFIX, TWO_CHOICES, lambda f: f.rps),
            0.95,
        ),
    ]


def hit_rate_bound(runs: Runs) -> list[float]:
    """Repeat by repeat, the most the hit-rate goal's ratio could be on this load: the prefix-aware
    run's reachable hit rate over the power-of-two run's measured one."""
    subjects = runs.get(ROUTED_CONVERSATIONS, {})
    pairs = zip(subjects.get(PREFIX, []), subjects.get(TWO_CHOICES, []), strict=False)
    return [ratio(aware.reachable_hit_rate, two.hit_rate) for aware, two in pairs]


def peer_goals(peers: PeerResults, subjects: Sequence[str] = ("batchd", "uncached")) -> list[Goal]:
    """Each of batchd's subjects over the best other peer on the generator, tokens a second,
    repeat by repeat: ahead by more than the noise when even its lowest repeat is above 1."""
    goals = []
    by_repeat: dict[int, dict[str, float]] = {}
    for run in peers.runs:
        if run.model == "gpt2" and run.measured:
            by_repeat.setdefault(run.repeat, {})[run.peer] = run.tokens_per_s
    others = {peer for repeat in by_repeat.values() for peer in repeat} - {*subjects, "baseline", "unbatched"}
    for subject in subjects:
        ratios = []
        for repeat in sorted(by_repeat):
            rivals = [value for peer, value in by_repeat[repeat].items() if peer in others]
            if subject in by_repeat[repeat] and rivals:
                ratios.append(ratio(by_repeat[repeat][subject], max(rivals)))
        goals.append(median_at_least(f"generator: {subject} tokens/s over the best peer's", ratios, 1.0))
    return goals


def medians(runs: Runs) -> dict[str, dict[str, Figures]]:
    """Each figure's median over the repeats (errors and requests summed)."""
    return {
        load: {subject: median_over_repeats(repeats) for subject, repeats in subjects.items()}
        for load, subjects in runs.items()
    }


@dataclass(frozen=True)
class Part:
    """One part's runs and goals; what it ran with, in words."""

    setup: str
    runs: Runs
    goals: list[Goal]
    rates: dict[str, float]  # the open loops' arrival rates, requests/s, median over repeats


@dataclass(frozen=True)
class Results:
    """What prefix.json holds."""

    meta: RunRecord
    options: dict[str, object]
    replica: Part | None = None
    routing: Part | None = None
    peers: PeerResults | None = None
    peer_goals: list[Goal] | None = None
