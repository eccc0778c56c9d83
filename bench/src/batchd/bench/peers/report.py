"""peers.md from peers.json: a table per model (medians, ratios to Mosec and to batchd), the MiniLM
ceiling, the goals, where a peer is ahead of batchd, and the peers that could not run and why.
peers.png: req/s and server CPU per request for each peer, one column of panels per model; a bar
is the median over repeats (its value printed above it), its whisker the lowest and highest
repeat; a panel whose bars span more than LOG_SCALE_FROM times is drawn on a log scale."""

from __future__ import annotations

from pathlib import Path

from batchd.bench.kit.charts import panels
from batchd.bench.kit.formatting import figure, number, share, verdict
from batchd.bench.kit.records import ran
from batchd.bench.kit.stats import median
from batchd.bench.peers import analysis
from batchd.bench.peers.analysis import Results
from batchd.bench.peers.catalog import MODELS, PEERS

FIGURE_NAMES = {"rps": "req/s", "p99_ms": "p99", "cpu_ms_per_request": "server CPU per request"}


def model_table(results: Results, model: str, table: list[analysis.Row]) -> list[str]:
    spec = MODELS[model]
    tokens = "| tokens/s " if spec.tokens else ""
    staggered = ", their starts spread over the warm-up" if spec.staggered else ""
    lines = [
        f"## {spec.title}, max batch 32, 10 ms wait, {spec.clients} clients (closed loop{staggered})",
        "",
        f"| server | req/s {tokens}| p50 ms | p99 ms | server CPU ms/request | RSS MB (tree) | PSS MB (tree) "
        "| processes "
        "| req/s vs Mosec | req/s vs batchd | CPU/req vs Mosec | CPU/req vs batchd |",
        "|---|---:|"
        + ("---:|" if spec.tokens else "")
        + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in table:
        if row.model != model:
            continue
        title = PEERS[row.peer].title
        if not row.repeats:
            lines.append(
                f"| {title} | not measured: {_one_line(row.failure)} |" + " |" * (12 if tokens else 11)
            )
            continue
        m = row.medians
        made = f"| {figure(m['tokens_per_s'])} " if spec.tokens else ""
        lines.append(
            f"| {title} | {figure(m['rps'])} {made}| {number(m['p50_ms'])} | {number(m['p99_ms'])} "
            f"| {number(m['cpu_ms_per_request'], 3)} | {figure(m['rss_mb'])} | {figure(m['pss_mb'])} "
            f"| {row.processes} | {number(row.vs['mosec']['rps'], 2)} | {number(row.vs['batchd']['rps'], 2)} "
            f"| {number(row.vs['mosec']['cpu_ms_per_request'], 2)} "
            f"| {number(row.vs['batchd']['cpu_ms_per_request'], 2)} |"
        )
    errors = [row for row in table if row.model == model and row.errors]
    for row in errors:
        lines.append(
            f"\n{PEERS[row.peer].title} answered {row.errors} request(s) with an error (all repeats)."
        )
    if model == "minilm" and results.ceilings:
        ceiling = analysis.ceiling_items_per_s(results.ceilings)
        threads = results.ceilings[0].threads
        shares = ", ".join(
            f"{PEERS[row.peer].title} {share(row.ceiling_share)}"
            for row in table
            if row.model == model and row.repeats
        )
        lines += [
            "",
            f"The model alone, in-process, batches of 32 on the servers' core ({threads} torch thread): "
            f"{figure(ceiling)} items/s. Each server's share of it: {shares}.",
        ]
    return [*lines, ""]


def _one_line(text: str, limit: int = 160) -> str:
    first = " ".join(text.split())
    return first if len(first) <= limit else first[: limit - 3] + "..."


def to_markdown(results: Results) -> str:
    table = analysis.rows(results)
    options = results.options
    lines = [
        "# Peers: batchd beside the Python serving frameworks with dynamic batching",
        "",
        f"Measured by {ran(results.meta)}.",
        "",
        f"Each server alone on the machine while it is measured ({results.placement}); the same "
        f"closed-loop load generator for all; {options['repeats']} repeat(s) of "
        f"{options['duration_s']:g} s per server and model after {options['warmup_s']:g} s of warm-up, "
        f"the servers' order turned every repeat; the models on {options.get('device', 'cpu')}; "
        "medians over repeats, ratios taken within each repeat. Server CPU and memory are the "
        "whole process tree's (from /proc). Read the ratios within one run, not absolute figures: "
        "the machines these runs were made on are shared.",
        "",
    ]
    for model in options["models"]:
        lines += model_table(results, model, table)
    lines += ["## Goals", "", "| goal | measured | |", "|---|---:|---|"]
    for goal in analysis.goals(results):
        detail = f" ({goal.detail})" if goal.detail else ""
        lines.append(f"| {goal.text} | {number(goal.measured, 2)}{detail} | {verdict(goal.ok)} |")
    leads = analysis.leads(table)
    lines += [
        "",
        "## Where a peer is ahead of batchd",
        "",
        f"By more than {analysis.LEAD_FROM:g}x (ratios within each repeat, medians).",
        "",
    ]
    if not leads:
        lines.append("Nowhere, in this run.")
    for lead in leads:
        lines.append(
            f"- {MODELS[lead.model].title}: {PEERS[lead.peer].title}, {FIGURE_NAMES[lead.figure]} "
            f"{number(lead.factor, 2)}x better than batchd's"
        )
    lines += ["", "## The servers", "", "| server | version | how it serves | |", "|---|---|---|---|"]
    for info in results.peers:
        status = _one_line(info.unavailable) if info.unavailable else ""
        lines.append(f"| {info.title} | {info.version or 'this checkout'} | {info.how} | {status} |")
    failures = [
        row for row in table if not row.repeats and row.failure and not _unavailable(results, row.peer)
    ]
    if failures:
        lines += ["", "Servers that did not start or answer (the end of their logs):", ""]
        for row in failures:
            lines += [
                f"- {PEERS[row.peer].title} on {row.model}:",
                "",
                "```",
                row.failure.strip()[-1500:],
                "```",
            ]
    return "\n".join(lines) + "\n"


def _unavailable(results: Results, peer: str) -> bool:
    return any(info.name == peer and info.unavailable for info in results.peers)


PANELS = (
    ("rps", "requests/s (higher is better)"),
    ("cpu_ms_per_request", "server CPU ms per request (lower is better)"),
)


# Past this ratio between the highest and the lowest bar of a panel, its scale is logarithmic.
LOG_SCALE_FROM = 20


def _label(value: float) -> str:
    """Two significant figures at least: 0.049 ms, 6.1 ms, 4,808 req/s."""
    return number(value, 3) if value < 1 else figure(value)


def draw(results: Results, path: Path) -> None:
    models = list(results.options["models"])
    with panels(path, len(PANELS), len(models), (4.8 * len(models) + 1, 7.5), constrained_layout=True) as (
        canvas,
        grid,
    ):
        for column, model in enumerate(models):
            names = [info.name for info in results.peers if model in PEERS[info.name].models]
            for row, (name, label) in enumerate(PANELS):
                ax = grid[row][column]
                shown: list[float] = []
                for index, peer in enumerate(names):
                    spread = analysis.spread(results.runs, model, peer, name)
                    if not spread.values:
                        ax.annotate("n/a", (index, 0), ha="center", va="bottom", fontsize=8, color="grey")
                        continue
                    middle = median(spread.values)
                    reference = PEERS[peer].reference  # the floor: a bound, drawn apart
                    color = "C0" if peer == "batchd" else "white" if reference else "C7"
                    ax.bar(index, middle, color=color, edgecolor="C7", hatch="//" if reference else None)
                    ax.vlines(index, spread.low, spread.high, color="black", lw=1)
                    ax.annotate(_label(middle), (index, spread.high), ha="center", va="bottom", fontsize=7)
                    shown.append(middle)
                ax.set_xticks(
                    range(len(names)), [PEERS[peer].title for peer in names], rotation=30, fontsize=8
                )
                ax.set_ylabel(label, fontsize=8)
                if shown and min(shown) > 0 and max(shown) / min(shown) > LOG_SCALE_FROM:
                    ax.set_yscale("log")  # else the slowest peers' bars would not show
                ax.grid(axis="y", alpha=0.3)
                if row == 0:
                    ax.set_title(f"{MODELS[model].title}, {MODELS[model].clients} clients", fontsize=10)
        canvas.suptitle(
            "Peers on the same models and load (bar: median of repeats; line: lowest to highest)", fontsize=10
        )
