"""The peers benchmark's judgement of its runs (`kit.peer_servers.results`): the goals, where a
peer is ahead of batchd, and each figure's spread over repeats (the chart's whiskers).

A ratio between two peers is taken within each repeat (the two ran minutes apart, in the same
conditions) and the median of those is quoted, rather than a ratio of medians from different
minutes of a shared machine."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from batchd.bench.kit.goals import Goal, at_least, at_most
from batchd.bench.kit.peer_servers.catalog import PEERS
from batchd.bench.kit.peer_servers.results import Results, Row, Run, ceiling_share, measured_runs, paired
from batchd.bench.kit.stats import median

# The goals (ratios in one run), checked and reported; a run that misses one still writes its
# figures. The trivial adder: batchd's CPU per request, throughput and p99 at least Mosec's, and
# this share of bare uvicorn's throughput. MiniLM: batchd's throughput at least every peer's,
# this share of the model's own ceiling and this multiple of batchd unbatched; idle memory at most
# this much above the model alone in a process, warm (torch's own import is most of a replica's
# memory and depends on its build: the CUDA build of torch 2.13 holds about 500 MB once imported).
FLOOR_GOAL = 0.5
CEILING_GOAL = 0.95
BATCHING_GAIN_GOAL = 3.5
IDLE_OVERHEAD_GOAL_MB = 64.0
# A peer is said to be ahead of batchd only by more than this factor: closer than that, one
# repeat's neighbours on a shared machine move the figures further.
LEAD_FROM = 1.05


@dataclass(frozen=True)
class Lead:
    """A peer ahead of batchd on one figure (median of per-repeat ratios)."""

    peer: str
    model: str
    figure: str  # "rps" | "p99_ms" | "cpu_ms_per_request"
    factor: float  # how many times better than batchd (> 1)


def goals(results: Results) -> list[Goal]:
    """The benchmark's goals against its peers, each as a ratio in this run."""
    runs = results.runs
    found: list[Goal] = []
    if "adder" in results.options["models"]:
        cpu = paired(runs, "adder", "batchd", "mosec", "cpu_ms_per_request")
        rps = paired(runs, "adder", "batchd", "mosec", "rps")
        p99 = paired(runs, "adder", "batchd", "mosec", "p99_ms")
        floor = paired(runs, "adder", "batchd", "floor", "rps")
        found += [
            at_most("Trivial adder: server CPU per request <= Mosec's (batchd / Mosec)", cpu, 1),
            at_least("Trivial adder: throughput >= Mosec's (batchd / Mosec)", rps, 1),
            at_most("Trivial adder: p99 <= Mosec's (batchd / Mosec)", p99, 1),
            at_least(
                f"Trivial adder: throughput >= {FLOOR_GOAL:g} of bare uvicorn's (batchd / floor)",
                floor,
                FLOOR_GOAL,
            ),
        ]
    if any(run.model == "gpt2" and run.measured for run in results.runs):
        lowest, closest = _lowest_against_peers(results, "gpt2", "tokens_per_s")
        found.append(
            at_least(
                "Generator: tokens/s >= every peer's (batchd / the closest peer)",
                lowest,
                1,
                detail=f"closest: {closest}" if closest else "no peer measured",
            )
        )
    if "minilm" in results.options["models"]:
        lowest, closest = _lowest_against_peers(results, "minilm", "rps")
        share = ceiling_share(runs, results.ceilings, "batchd")
        gain = paired(runs, "minilm", "batchd", "unbatched", "rps")
        idle = median([run.idle_rss_mb for run in measured_runs(runs, "minilm", "batchd").values()])
        alone = median([ceiling.rss_mb for ceiling in results.ceilings])
        found += [
            at_least(
                "MiniLM: throughput >= every peer's (batchd / the closest peer)",
                lowest,
                1,
                detail=f"closest: {closest}" if closest else "no peer measured",
            ),
            at_least(
                f"MiniLM: throughput >= {CEILING_GOAL:g} of the model's batched ceiling (batchd / ceiling)",
                share,
                CEILING_GOAL,
            ),
            at_least(
                f"MiniLM: throughput >= {BATCHING_GAIN_GOAL:g}x unbatched (batchd / max_batch_size 1)",
                gain,
                BATCHING_GAIN_GOAL,
            ),
            at_most(
                f"MiniLM: idle memory within {IDLE_OVERHEAD_GOAL_MB:g} MB of the model alone in a process "
                "(batchd - ceiling, MB)",
                idle - alone,
                IDLE_OVERHEAD_GOAL_MB,
                detail=f"batchd {idle:.0f} MB, the model alone {alone:.0f} MB",
            ),
        ]
    return found


def _lowest_against_peers(results: Results, model: str, figure: str) -> tuple[float, str]:
    """batchd's figure over each peer's (the median of ratios within each repeat): the lowest, and
    whose it is."""
    others = [info.name for info in results.peers if info.name != "batchd" and not PEERS[info.name].reference]
    versus = {peer: paired(results.runs, model, "batchd", peer, figure) for peer in others}
    measured = {peer: value for peer, value in versus.items() if not math.isnan(value)}
    closest = min(measured, key=measured.__getitem__, default="")
    return (measured[closest] if closest else math.nan), closest


def leads(table: Sequence[Row]) -> list[Lead]:
    """Every (peer, model, figure) where a peer beats batchd by more than LEAD_FROM: more req/s, a
    lower p99, less CPU per request."""
    found: list[Lead] = []
    for row in table:
        if row.peer == "batchd" or PEERS[row.peer].reference:
            continue
        against = row.vs["batchd"]
        if against["rps"] > LEAD_FROM:
            found.append(Lead(row.peer, row.model, "rps", against["rps"]))
        for figure in ("p99_ms", "cpu_ms_per_request"):
            if 0 < against[figure] < 1 / LEAD_FROM:
                found.append(Lead(row.peer, row.model, figure, 1 / against[figure]))
    return found


@dataclass(frozen=True)
class Spread:
    """The lowest and highest of a figure over repeats (the chart's whiskers)."""

    low: float
    high: float
    values: list[float] = field(default_factory=list)


def spread(runs: Sequence[Run], model: str, peer: str, figure: str) -> Spread:
    values = [getattr(run, figure) for run in measured_runs(runs, model, peer).values()]
    clean = [value for value in values if not math.isnan(value)]
    return Spread(min(clean, default=math.nan), max(clean, default=math.nan), clean)
