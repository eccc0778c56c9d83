"""A model's table of the peer servers side by side: medians over repeats, the ratios to Mosec and to
batchd within each repeat, the errors, and (MiniLM) each server's share of the model's ceiling."""

from __future__ import annotations

from batchd.bench.kit.formatting import figure, number, share
from batchd.bench.kit.peer_servers.catalog import MODELS, PEERS
from batchd.bench.kit.peer_servers.results import Results, Row, ceiling_items_per_s


def model_table(results: Results, model: str, table: list[Row]) -> list[str]:
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
                f"| {title} | not measured: {one_line(row.failure)} |" + " |" * (12 if tokens else 11)
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
        ceiling = ceiling_items_per_s(results.ceilings)
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


def one_line(text: str, limit: int = 160) -> str:
    first = " ".join(text.split())
    return first if len(first) <= limit else first[: limit - 3] + "..."
