"""prefix.md and prefix.png: per part, a row per load and subject (medians over repeats), the goals
(ratios within each repeat: median and range), and the peers' generator table; the chart shows
what the cache and the routing change, and the generator's tokens/s beside the peers'."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from batchd.bench.kit.charts import panels
from batchd.bench.kit.formatting import figure, number, share
from batchd.bench.kit.goals import Goal, table_over_repeats
from batchd.bench.kit.peer_servers import results as peer_results
from batchd.bench.kit.peer_servers.catalog import PEERS
from batchd.bench.kit.peer_servers.table import model_table
from batchd.bench.kit.records import ran
from batchd.bench.prefix.analysis import (
    CACHED,
    CONVERSATION_TURNS,
    HOT_CAPACITY,
    PREFIX,
    ROUTED_CONVERSATIONS,
    ROUTED_HOT,
    ROUTED_UNIQUE,
    SYSTEM_CAPACITY,
    SYSTEM_LATENCY,
    TWO_CHOICES,
    UNCACHED,
    UNIQUE_CAPACITY,
    Figures,
    Part,
    Results,
    medians,
)
from batchd.router.prefixes import OUTCOMES

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from batchd.bench.kit.peer_servers.results import Results as PeerResults

HEAD = (
    "| load | subject | req/s | output tokens/s | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | hit rate "
    "| answered | errors |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def _part(title: str, part: Part) -> list[str]:
    lines = [f"## {title}", "", part.setup + ".", ""]
    if part.rates:
        rates = ", ".join(f"{load}: {number(rate, 2)} req/s" for load, rate in part.rates.items())
        lines += [f"Open loops' arrival rates (medians over repeats): {rates}.", ""]
    lines.append(HEAD)
    for load, subjects in medians(part.runs).items():
        for subject, found in subjects.items():
            lines.append(
                f"| {load} | {subject} | {number(found.rps, 2)} | {figure(found.tokens_per_s)} "
                f"| {figure(found.ttft_p50_ms)} | {figure(found.ttft_p90_ms)} | {figure(found.ttft_p99_ms)} "
                f"| {share(found.hit_rate)} | {found.completed} | {found.errors} |"
            )
    samples = [
        s
        for subjects in part.runs.values()
        for runs in subjects.values()
        for f in runs
        for s in f.error_samples
    ]
    if samples:
        lines += ["", f"Errors, for example: `{samples[0][:200]}`"]
    return [*lines, ""]


def to_markdown(results: Results) -> str:
    lines = [
        "# Prefix caching and prefix-aware routing",
        "",
        f"Measured by {ran(results.meta)}.",
        "",
        "Every request through the OpenAI routes, streamed; the time to first token is when its first "
        "text arrived, from when it was due (open loops) or sent (closed loops and conversations); the "
        "hit rate is the prompt tokens the answers' usage says were cached over all prompt tokens. "
        "Completions a second of a closed loop are each client's own rate summed (its answers after "
        "its first in the window, over the time from its first to its last); of an open loop, from "
        "the first answer of the window to its last. Ratios are taken within each repeat.",
        "",
    ]
    goals: list[Goal] = []
    if results.replica is not None:
        lines += _part("One replica: the cache on and off", results.replica)
        goals += results.replica.goals
    if results.routing is not None:
        lines += _part("Two replicas: prefix-aware routing and the power of two choices", results.routing)
        reachable = {
            subject: share(found.reachable_hit_rate)
            for subject, found in medians(results.routing.runs).get(ROUTED_CONVERSATIONS, {}).items()
            if not math.isnan(found.reachable_hit_rate)  # runs from before it was measured
        }
        if reachable:
            lines += [
                "The open loop's reachable hit rate, had every turn gone to the replica that served "
                "the turn before it (its blocks, as the answers' token counts bound them, and nothing "
                "evicted): "
                + ", ".join(f"{rate} in the {subject} run" for subject, rate in reachable.items())
                + ".",
                "",
            ]
        lines += _routes(medians(results.routing.runs))
        goals += results.routing.goals
    if results.peers is not None:
        table = peer_results.rows(results.peers)
        ran_for = results.peers.options
        lines += [
            "## The peers' generator load, the cache on and off",
            "",
            f"`batchd.bench.peers` on its tiny GPT-2 ({results.peers.placement}); "
            f"{ran_for['repeats']} repeat(s) of {ran_for['duration_s']:g} s after "
            f"{ran_for['warmup_s']:g} s of warm-up, over which the clients' starts are spread.",
            "",
            *model_table(results.peers, "gpt2", table),
        ]
        unavailable = [info for info in results.peers.peers if info.unavailable]
        for info in unavailable:
            lines.append(f"- {info.title}: {info.unavailable.splitlines()[0][:200]}")
        goals += results.peer_goals or []
    lines += ["", "## Goals", "", *table_over_repeats(goals)]
    return "\n".join(lines) + "\n"


def _bars(ax: Axes, labels: list[str], groups: dict[str, list[float]], ylabel: str, title: str) -> None:
    """Bars side by side per label, one colour per group, each with its value."""
    width = 0.8 / max(1, len(groups))
    for index, (name, values) in enumerate(groups.items()):
        positions = [n + (index - (len(groups) - 1) / 2) * width for n in range(len(labels))]
        ax.bar(positions, values, width, label=name)
        for x, value in zip(positions, values, strict=True):
            if math.isfinite(value):
                ax.annotate(figure(value), (x, value), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def _routes(found: dict[str, dict[str, Figures]]) -> list[str]:
    """How the prefix-aware router routed each load's requests, by its own count (summed over the
    repeats); nothing for runs from before it was counted."""
    counted = [
        f"{load}: "
        + ", ".join(f"{found[load][PREFIX].routes.get(outcome, 0):,} {outcome}" for outcome in OUTCOMES)
        for load in found
        if PREFIX in found[load] and found[load][PREFIX].routes
    ]
    if not counted:
        return []
    return [
        "How the prefix-aware router routed the requests, by its own count (`hit`: to a replica it had "
        "sent the start of the prompt to; `imbalanced`: such a replica was too busy for the load guard; "
        "`miss`: none was): " + "; ".join(counted) + ".",
        "",
    ]


NOTHING = Figures(0, 0, 0, [], math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)


def _of(found: dict[str, dict[str, Figures]], load: str, subject: str) -> Figures:
    return found.get(load, {}).get(subject, NOTHING)


def draw_chart(results: Results, path: Path) -> None:
    """One panel per figure the run measured (a part it left out draws nothing)."""
    drawers: list[Callable[[Axes], None]] = []
    if results.replica is not None:
        drawers += [
            functools.partial(_replica_capacity, medians(results.replica.runs)),
            functools.partial(_replica_ttft, medians(results.replica.runs)),
        ]
    if results.routing is not None:
        drawers.append(functools.partial(_routing, medians(results.routing.runs)))
    if results.peers is not None:
        drawers.append(functools.partial(_peers, results.peers))
    columns = min(2, max(1, len(drawers)))
    rows = max(1, math.ceil(len(drawers) / columns))
    with panels(path, rows, columns, (5.5 * columns, 4 * rows), constrained_layout=True) as (canvas, grid):
        axes = [ax for row in grid for ax in row]
        for draw, ax in zip(drawers, axes, strict=False):
            draw(ax)
        for ax in axes[len(drawers) :]:
            ax.set_visible(False)
        canvas.suptitle("Prefix caching and prefix-aware routing (medians over repeats)", fontsize=10)


def _replica_capacity(found: dict[str, dict[str, Figures]], ax: Axes) -> None:
    loads = {
        "system prompts": SYSTEM_CAPACITY,
        "one hot prefix": HOT_CAPACITY,
        "unique prompts": UNIQUE_CAPACITY,
    }
    rps = {s: [_of(found, load, s).rps for load in loads.values()] for s in (CACHED, UNCACHED)}
    _bars(ax, list(loads), rps, "requests/s (closed loop)", "One replica: capacity")


def _replica_ttft(found: dict[str, dict[str, Figures]], ax: Axes) -> None:
    timed = {"system prompts (open loop)": SYSTEM_LATENCY, "conversations, turns 3-6": CONVERSATION_TURNS}
    ttft = {s: [_of(found, load, s).ttft_p50_ms for load in timed.values()] for s in (CACHED, UNCACHED)}
    _bars(ax, list(timed), ttft, "ms", "One replica: time to first token, p50")


def _routing(found: dict[str, dict[str, Figures]], ax: Axes) -> None:
    routed = {
        s: [
            _of(found, ROUTED_CONVERSATIONS, s).hit_rate * 100,
            _of(found, ROUTED_CONVERSATIONS, s).ttft_p90_ms / 10,
            _of(found, ROUTED_HOT, s).rps,
            _of(found, ROUTED_UNIQUE, s).rps,
        ]
        for s in (PREFIX, TWO_CHOICES)
    }
    labels = ["hit rate, %", "TTFT p90, 10 ms", "hot prefix, req/s", "unique, req/s"]
    _bars(ax, labels, routed, "", "Two replicas: conversations at 70% of capacity; throughput")


def _peers(peers: PeerResults, ax: Axes) -> None:
    rows = [row for row in peer_results.rows(peers) if row.repeats and row.model == "gpt2"]
    for index, row in enumerate(rows):
        made = row.medians["tokens_per_s"]
        ax.bar(index, made, color="C0" if row.peer in ("batchd", "uncached") else "C7")
        ax.annotate(figure(made), (index, made), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)), [PEERS[row.peer].title for row in rows], rotation=30, fontsize=7)
    ax.set_ylabel("output tokens/s", fontsize=8)
    ax.set_title("The peers' tiny GPT-2 load: 32 clients, 64 tokens each", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
