"""The /proc figures of a process: what the benchmarks and the overload tests read."""

from __future__ import annotations

import os

from batchd.bench.kit import procstat


def test_proc_stat_parsing_survives_a_command_name_with_spaces_and_parens() -> None:
    ticks = procstat.CLOCK_TICKS
    fields = ["S"] + ["0"] * 10 + [str(3 * ticks), str(ticks)] + ["0"] * 30
    line = f"1234 (odd (name) x) {' '.join(fields)}"
    assert procstat.parse_stat_cpu_s(line) == 4.0


def test_this_process_reports_memory_and_cpu() -> None:
    sample = procstat.sample(os.getpid())
    assert 0 < sample.rss_bytes <= sample.peak_rss_bytes
    assert sample.cpu_s > 0
