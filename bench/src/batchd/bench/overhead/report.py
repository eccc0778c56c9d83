"""The overhead benchmark's report: a Markdown table of medians and ratios, and the same as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batchd.bench.kit.formatting import figure, number
from batchd.bench.kit.records import from_json, publish, ran
from batchd.bench.overhead import subjects
from batchd.bench.overhead.results import Results

RATIO_LABELS = {
    "throughput_rps": "req/s",
    "p50_ms": "p50",
    "p99_ms": "p99",
    "server_cpu_ms_per_request": "server CPU/request",
}


def to_markdown(results: Results) -> str:
    lines = [
        "# Server overhead on the trivial adder",
        "",
        f"Measured with {ran(results.meta, f'{len(results.summaries)} subjects interleaved')}.",
        "",
        f"The trivial adder, max batch {subjects.MAX_BATCH_SIZE}, {subjects.BATCH_WAIT_S * 1000:g} ms "
        f"wait; a closed loop of {results.clients} clients for {results.duration_s:g} s per run; the "
        "server on one core, the load generator on the other; medians over the repeats. Server CPU "
        "is user + system time of the server's processes over the measured window.",
        "",
        "| server | repeats | req/s | p50 ms | p99 ms | server CPU ms/request | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in results.summaries:
        lines.append(
            f"| {s.subject} | {s.repeats} | {figure(s.throughput_rps)} | {number(s.p50_ms)} | "
            f"{number(s.p99_ms)} | {number(s.server_cpu_ms_per_request, 4)} | {s.errors} |"
        )
    if results.ratios:
        lines += ["", "| ratio of medians | " + " | ".join(RATIO_LABELS.values()) + " |"]
        lines.append("|---|" + "---:|" * len(RATIO_LABELS))
        for pair, values in results.ratios.items():
            cells = " | ".join(number(values[key], 2) for key in RATIO_LABELS)
            lines.append(f"| {pair} | {cells} |")
    lines += ["", "Every run:", "", "| repeat | server | req/s | p50 ms | p99 ms | server CPU ms/request |"]
    lines.append("|---:|---|---:|---:|---:|---:|")
    for m in results.measurements:
        lines.append(
            f"| {m.repeat} | {m.subject} | {figure(m.throughput_rps)} | {number(m.p50_ms)} | "
            f"{number(m.p99_ms)} | {number(m.server_cpu_ms_per_request, 4)} |"
        )
    return "\n".join(lines) + "\n"


def write_results(results: Results, output_dir: Path, stem: str = "overhead") -> Path:
    """`<stem>.json` and `<stem>.md`; returns the JSON file's path."""
    return publish(output_dir, stem, results, to_markdown(results))


def read_results(path: Path) -> Results:
    raw: Any = json.loads(path.read_text())
    return from_json(Results, raw)
