"""What a side-by-side run of the peer servers measured, and its table: medians over repeats and
ratios within a repeat; pure functions over `Results`, so that a report's numbers can be checked on
made-up runs.

A ratio between two peers is taken within each repeat (the two ran minutes apart, in the same
conditions) and the median of those is quoted, rather than a ratio of medians from different
minutes of a shared machine.

What a report's .json holds of the peers is here too, as frozen dataclasses (read back with
`kit.records.from_json`): every run of every peer, so that the report can be made again from the
file."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from batchd.bench.kit.peer_servers.catalog import PEERS
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import within_repeats
from batchd.bench.kit.stats import median, ratio


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


def measured_runs(runs: Sequence[Run], model: str, peer: str) -> dict[int, Run]:
    return {run.repeat: run for run in runs if run.model == model and run.peer == peer and run.measured}


def paired(runs: Sequence[Run], model: str, peer: str, reference: str, figure: str) -> float:
    """The median over repeats of `peer`'s figure over `reference`'s in the same repeat."""
    measured = [run for run in runs if run.model == model and run.measured]
    return median(
        within_repeats(measured, lambda r: (r.peer, r.repeat), peer, reference, lambda r: getattr(r, figure))
    )


def ceiling_items_per_s(ceilings: Sequence[CeilingRun]) -> float:
    return median([ceiling.items_per_s for ceiling in ceilings])


def ceiling_share(runs: Sequence[Run], ceilings: Sequence[CeilingRun], peer: str) -> float:
    """MiniLM req/s over the ceiling measured in the same repeat, median over repeats."""
    by_repeat = {ceiling.repeat: ceiling.items_per_s for ceiling in ceilings}
    mine = measured_runs(runs, "minilm", peer)
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
