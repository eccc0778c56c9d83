"""peers.md from peers.json: a table per model (medians, ratios to Mosec and to batchd), the MiniLM
ceiling, the goals, where a peer is ahead of batchd, and the peers that could not run and why."""

from __future__ import annotations

import json
from pathlib import Path

from batchd.bench.kit.formatting import figure, number, share, verdict
from batchd.bench.kit.records import from_json, publish, ran
from batchd.bench.peers import analysis
from batchd.bench.peers.catalog import MODELS, PEERS
from batchd.bench.peers.results import Results

FIGURE_NAMES = {"rps": "req/s", "p99_ms": "p99", "cpu_ms_per_request": "server CPU per request"}


def write_results(output_dir: Path, results: Results) -> None:
    publish(output_dir, "peers", results, to_markdown(results))


def read_results(path: Path) -> Results:
    return from_json(Results, json.loads(path.read_text()))


def _ratio(value: float) -> str:
    return number(value, 2) if value == value else "-"


def _table(results: Results, model: str, table: list[analysis.Row]) -> list[str]:
    spec = MODELS[model]
    lines = [
        f"## {spec.title}, max batch 32, 10 ms wait, {spec.clients} clients (closed loop)",
        "",
        "| server | req/s | p50 ms | p99 ms | server CPU ms/request | RSS MB (tree) | PSS MB (tree) "
        "| processes "
        "| req/s vs Mosec | req/s vs batchd | CPU/req vs Mosec | CPU/req vs batchd |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in table:
        if row.model != model:
            continue
        title = PEERS[row.peer].title
        if not row.repeats:
            lines.append(f"| {title} | not measured: {_one_line(row.failure)} |" + " |" * 11)
            continue
        m = row.medians
        lines.append(
            f"| {title} | {figure(m['rps'])} | {number(m['p50_ms'])} | {number(m['p99_ms'])} "
            f"| {number(m['cpu_ms_per_request'], 3)} | {figure(m['rss_mb'])} | {figure(m['pss_mb'])} "
            f"| {row.processes} | {_ratio(row.vs['mosec']['rps'])} | {_ratio(row.vs['batchd']['rps'])} "
            f"| {_ratio(row.vs['mosec']['cpu_ms_per_request'])} "
            f"| {_ratio(row.vs['batchd']['cpu_ms_per_request'])} |"
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
        lines += _table(results, model, table)
    lines += ["## Goals", "", "| goal | measured | |", "|---|---:|---|"]
    for goal in analysis.goals(results):
        detail = f" ({goal.detail})" if goal.detail else ""
        lines.append(f"| {goal.text} | {_ratio(goal.measured)}{detail} | {verdict(goal.ok)} |")
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
