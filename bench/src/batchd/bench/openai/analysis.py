"""The OpenAI benchmark's figures: per run, medians over repeats, and the OpenAI route over the other."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.stats import median, percentile, ratio


@dataclass(frozen=True)
class EmbeddingRun:
    """One route at one client count, one repeat."""

    route: str
    clients: int
    repeat: int
    requests_per_s: float
    p99_ms: float
    errors: int


@dataclass(frozen=True)
class StreamingRun:
    route: str
    clients: int
    repeat: int
    tokens_per_s: float  # output tokens of the answers completed in the window, over the window
    ttft_p99_ms: float
    answers: int
    errors: int
    # Every time to first token of the window: a window holds a few hundred at most, so its own p99
    # is one of its three largest; the point's p99 is taken over every repeat's together.
    ttft_ms: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class EmbeddingPoint:
    """Both routes at one client count: medians over the repeats."""

    clients: int
    requests_per_s: dict[str, float]
    p99_ms: dict[str, float]
    errors: int
    throughput_share: float  # the OpenAI route's req/s over KServe V1's: the median of each repeat's


@dataclass(frozen=True)
class StreamingPoint:
    clients: int
    tokens_per_s: dict[str, float]
    ttft_p99_ms: dict[str, float]  # over every repeat's first tokens together (see `pooled_p99`)
    errors: int
    throughput_share: float  # the OpenAI route's tokens/s over generate_stream's (median of repeats')
    ttft_share: float  # generate_stream's p99 TTFT over the OpenAI route's (above 1: OpenAI's sooner)


Run = TypeVar("Run", EmbeddingRun, StreamingRun)


@dataclass(frozen=True)
class Results:
    """What openai.json holds."""

    meta: RunRecord
    repeats: int
    torch_threads: int
    embeddings: list[EmbeddingPoint]
    streaming: list[StreamingPoint]
    embedding_runs: list[EmbeddingRun]
    streaming_runs: list[StreamingRun]


def rate_between_completions(done_s: Sequence[float]) -> float:
    """Completions per second from the first completion to the last, those at the first not counted.

    Answers come in waves (a batch of 32 embeddings, streams started together), so a count over a
    fixed window is off by up to a wave: over a few seconds that is several percent. Between two
    completions the count is exact."""
    if len(done_s) < 2:
        return float("nan")
    first, last = min(done_s), max(done_s)
    after = sum(1 for done in done_s if done > first)
    return after / (last - first) if last > first else float("nan")


def _by_route(runs: Sequence[Run], clients: int, figure: Callable[[Run], float]) -> dict[str, float]:
    """The median of `figure` over the repeats, per route, at `clients`."""
    at = [run for run in runs if run.clients == clients]
    return {
        route: median([figure(run) for run in at if run.route == route])
        for route in sorted({r.route for r in at})
    }


def _paired(runs: Sequence[Run], clients: int, figure: Callable[[Run], float], over: str) -> float:
    """The median over repeats of the OpenAI route's figure over route `over`'s in the same repeat,
    the two windows side by side."""
    at = [run for run in runs if run.clients == clients]
    ratios = []
    for repeat in sorted({run.repeat for run in at}):
        mine = [figure(run) for run in at if run.repeat == repeat and run.route == "openai"]
        theirs = [figure(run) for run in at if run.repeat == repeat and run.route == over]
        if mine and theirs:
            ratios.append(ratio(mine[0], theirs[0]))
    return median(ratios)


def _errors(runs: Sequence[Run], clients: int) -> int:
    return sum(run.errors for run in runs if run.clients == clients)


def _clients(runs: Sequence[Run]) -> list[int]:
    return sorted({run.clients for run in runs})


def embedding_points(runs: Sequence[EmbeddingRun], other: str = "kserve_v1") -> list[EmbeddingPoint]:
    points = []
    for clients in _clients(runs):
        rps = _by_route(runs, clients, lambda run: run.requests_per_s)
        p99 = _by_route(runs, clients, lambda run: run.p99_ms)
        share = _paired(runs, clients, lambda run: run.requests_per_s, other)
        points.append(EmbeddingPoint(clients, rps, p99, _errors(runs, clients), share))
    return points


def pooled_p99(runs: Sequence[StreamingRun], clients: int) -> dict[str, float]:
    """Per route, the p99 time to first token over every repeat's samples together. The routes
    share each repeat's window, so a slower machine in one repeat weighs on both; a
    repeat's own p99 (one of its three largest samples) moves by a fifth from repeat to repeat.
    Runs that kept no samples give the median of their own p99s instead."""
    at = [run for run in runs if run.clients == clients]
    p99 = {}
    for route in sorted({run.route for run in at}):
        mine = [run for run in at if run.route == route]
        samples = [ms for run in mine for ms in run.ttft_ms]
        p99[route] = percentile(samples, 99) if samples else median([run.ttft_p99_ms for run in mine])
    return p99


def streaming_points(
    runs: Sequence[StreamingRun], other: str = "oip_generate_stream"
) -> list[StreamingPoint]:
    points = []
    for clients in _clients(runs):
        tps = _by_route(runs, clients, lambda run: run.tokens_per_s)
        ttft = pooled_p99(runs, clients)
        share = _paired(runs, clients, lambda run: run.tokens_per_s, other)
        first = ratio(ttft.get(other, math.nan), ttft.get("openai", math.nan))
        points.append(StreamingPoint(clients, tps, ttft, _errors(runs, clients), share, first))
    return points
