"""Figures from the runs: medians over repeats, ratios within a repeat, the goals and where a peer
is ahead; pure functions over `Results`, so that the report's numbers can be checked on made-up runs.

A ratio between two peers is taken within each repeat (the two ran minutes apart, in the same
conditions) and the median of those is quoted, rather than a ratio of medians from different
minutes of a shared machine.

What peers.json holds is here too, as frozen dataclasses (read back with `kit.records.from_json`):
every run of every peer, so that the report can be made again from the file."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.stats import median, ratio
from batchd.bench.peers.catalog import (
    BATCHING_GAIN_GOAL,
    CEILING_GOAL,
    FLOOR_GOAL,
    IDLE_OVERHEAD_GOAL_MB,
    PEERS,
)


@dataclass(frozen=True)
class PeerInfo:
    name: str
    title: str
    version: str  # of its distribution, as pip installed it ("" for batchd: this checkout)
    how: str
    unavailable: str = ""  # why it could not be installed; "" when it was


@dataclass(frozen=True)
class Run:
    """One closed loop against one server, with its process tree read before and after; a run that
    could not be measured has `failure` set and NaN figures."""

    peer: str
    model: str
    repeat: int
    clients: int
    requests: int = 0  # answered 200 within the measured window
    errors: int = 0
    # Answers a second, each client's own rate summed (`loadgen.RunResult.steady_rps`), so that
    # answers that come in rounds resolve to a round's time.
    rps: float = math.nan
    tokens_per_s: float = math.nan  # the generator's: rps times the new tokens of an answer
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    cpu_ms_per_request: float = math.nan  # the whole server tree's CPU over the window
    cores_busy: float = math.nan  # that CPU over the window's length
    rss_mb: float = math.nan  # the tree's, at the end of the window
    pss_mb: float = math.nan
    processes: int = 0
    idle_rss_mb: float = math.nan  # the tree's after its first answer, before any load
    client_cpu_s: float = math.nan  # the load generator's own
    failure: str = ""
    error_samples: list[str] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return not self.failure


@dataclass(frozen=True)
class CeilingRun:
    """The MiniLM model alone, in-process, at the servers' max batch size, on the servers' cores."""

    repeat: int
    batch_size: int
    items_per_s: float
    threads: int
    rss_mb: float = math.nan  # the process, warm: the model alone


@dataclass(frozen=True)
class Results:
    meta: RunRecord
    options: dict[str, Any]
    placement: str  # which cores the servers and the load generator had
    peers: list[PeerInfo]
    runs: list[Run]
    ceilings: list[CeilingRun]


# The peers every other is compared with: the one the goals are set against, and ourselves.
REFERENCES = ("mosec", "batchd")
# A peer is said to be ahead of batchd only by more than this factor: closer than that, one
# repeat's neighbours on a shared machine move the figures further.
LEAD_FROM = 1.05
FIGURES = ("rps", "tokens_per_s", "p50_ms", "p99_ms", "cpu_ms_per_request", "rss_mb", "pss_mb")


@dataclass(frozen=True)
class Row:
    """One peer on one model: medians over its measured repeats, and ratios to the references."""

    peer: str
    model: str
    repeats: int  # measured
    medians: dict[str, float]  # by FIGURES name
    vs: dict[str, dict[str, float]]  # reference -> figure -> median of per-repeat ratios
    ceiling_share: float = math.nan  # req/s over the model's own ceiling (MiniLM)
    failure: str = ""  # why no repeat was measured
    errors: int = 0  # non-200 answers and failed requests, all repeats
    processes: int = 0


def _measured(runs: Sequence[Run], model: str, peer: str) -> dict[int, Run]:
    return {run.repeat: run for run in runs if run.model == model and run.peer == peer and run.measured}


def paired(runs: Sequence[Run], model: str, peer: str, reference: str, figure: str) -> float:
    """The median over repeats of `peer`'s figure over `reference`'s in the same repeat."""
    mine, theirs = _measured(runs, model, peer), _measured(runs, model, reference)
    shared = [repeat for repeat in mine if repeat in theirs]
    return median([ratio(getattr(mine[r], figure), getattr(theirs[r], figure)) for r in shared])


def ceiling_items_per_s(ceilings: Sequence[CeilingRun]) -> float:
    return median([ceiling.items_per_s for ceiling in ceilings])


def ceiling_share(runs: Sequence[Run], ceilings: Sequence[CeilingRun], peer: str) -> float:
    """MiniLM req/s over the ceiling measured in the same repeat, median over repeats."""
    by_repeat = {ceiling.repeat: ceiling.items_per_s for ceiling in ceilings}
    mine = _measured(runs, "minilm", peer)
    return median([ratio(run.rps, by_repeat[r]) for r, run in mine.items() if r in by_repeat])


def rows(results: Results) -> list[Row]:
    """A row per (model, peer) that was asked for, measured or not, in the options' order."""
    table: list[Row] = []
    models: Sequence[str] = results.options["models"]
    for model in models:
        for info in results.peers:
            if model not in PEERS[info.name].models:
                continue
            runs = [run for run in results.runs if run.model == model and run.peer == info.name]
            good = [run for run in runs if run.measured]
            failure = info.unavailable or next((run.failure for run in runs if run.failure), "")
            table.append(
                Row(
                    info.name,
                    model,
                    len(good),
                    {figure: median([getattr(run, figure) for run in good]) for figure in FIGURES},
                    {
                        reference: {
                            figure: paired(results.runs, model, info.name, reference, figure)
                            for figure in ("rps", "p99_ms", "cpu_ms_per_request")
                        }
                        for reference in REFERENCES
                    },
                    ceiling_share(results.runs, results.ceilings, info.name)
                    if model == "minilm"
                    else math.nan,
                    "" if good else failure,
                    sum(run.errors for run in good),
                    max((run.processes for run in good), default=0),
                )
            )
    return table


@dataclass(frozen=True)
class Goal:
    text: str
    measured: float  # the ratio the goal is about
    ok: bool | None  # None: not measured (a peer missing)
    detail: str = ""


@dataclass(frozen=True)
class Lead:
    """A peer ahead of batchd on one figure (median of per-repeat ratios)."""

    peer: str
    model: str
    figure: str  # "rps" | "p99_ms" | "cpu_ms_per_request"
    factor: float  # how many times better than batchd (> 1)


def _goal(
    text: str, value: float, *, at_most: float | None = None, at_least: float | None = None, detail: str = ""
) -> Goal:
    """A goal judged on `value`: not measured when it is NaN."""
    ok = (
        None if math.isnan(value) else value <= at_most if at_most is not None else value >= (at_least or 0.0)
    )
    return Goal(text, value, ok, detail)


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
            _goal("Trivial adder: server CPU per request <= Mosec's (batchd / Mosec)", cpu, at_most=1),
            _goal("Trivial adder: throughput >= Mosec's (batchd / Mosec)", rps, at_least=1),
            _goal("Trivial adder: p99 <= Mosec's (batchd / Mosec)", p99, at_most=1),
            _goal(
                f"Trivial adder: throughput >= {FLOOR_GOAL:g} of bare uvicorn's (batchd / floor)",
                floor,
                at_least=FLOOR_GOAL,
            ),
        ]
    if any(run.model == "gpt2" and run.measured for run in results.runs):
        lowest, closest = _lowest_against_peers(results, "gpt2", "tokens_per_s")
        found.append(
            _goal(
                "Generator: tokens/s >= every peer's (batchd / the closest peer)",
                lowest,
                at_least=1,
                detail=f"closest: {closest}" if closest else "no peer measured",
            )
        )
    if "minilm" in results.options["models"]:
        others = [
            info.name for info in results.peers if info.name != "batchd" and not PEERS[info.name].reference
        ]
        versus = {peer: paired(runs, "minilm", "batchd", peer, "rps") for peer in others}
        measured = {peer: value for peer, value in versus.items() if not math.isnan(value)}
        lowest = min(measured.values(), default=math.nan)
        closest = min(measured, key=measured.__getitem__, default="")
        share = ceiling_share(runs, results.ceilings, "batchd")
        gain = paired(runs, "minilm", "batchd", "unbatched", "rps")
        idle = median([run.idle_rss_mb for run in _measured(runs, "minilm", "batchd").values()])
        alone = median([ceiling.rss_mb for ceiling in results.ceilings])
        found += [
            _goal(
                "MiniLM: throughput >= every peer's (batchd / the closest peer)",
                lowest,
                at_least=1,
                detail=f"closest: {closest}" if closest else "no peer measured",
            ),
            _goal(
                f"MiniLM: throughput >= {CEILING_GOAL:g} of the model's batched ceiling (batchd / ceiling)",
                share,
                at_least=CEILING_GOAL,
            ),
            _goal(
                f"MiniLM: throughput >= {BATCHING_GAIN_GOAL:g}x unbatched (batchd / max_batch_size 1)",
                gain,
                at_least=BATCHING_GAIN_GOAL,
            ),
            _goal(
                f"MiniLM: idle memory within {IDLE_OVERHEAD_GOAL_MB:g} MB of the model alone in a process "
                "(batchd - ceiling, MB)",
                idle - alone,
                at_most=IDLE_OVERHEAD_GOAL_MB,
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
    values = [getattr(run, figure) for run in _measured(runs, model, peer).values()]
    clean = [value for value in values if not math.isnan(value)]
    return Spread(min(clean, default=math.nan), max(clean, default=math.nan), clean)
