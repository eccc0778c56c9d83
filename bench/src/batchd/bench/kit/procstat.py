"""CPU time and memory of another process by pid, read from /proc (Linux) without psutil.

The server runs in its own process; its CPU seconds over a run and its resident memory (now and
at its peak) go into the report beside the throughput it reached. `Sampler` keeps a series of
them while a load runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from batchd.bench.kit.periodic import Periodic

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessSample:
    cpu_s: float  # user + system, seconds since the process started
    rss_bytes: int  # resident now (VmRSS)
    peak_rss_bytes: int  # resident high-water mark (VmHWM)


def parse_stat_cpu_s(stat_line: str) -> float:
    """utime + stime (fields 14 and 15) in seconds; the command name may hold spaces and parens."""
    fields = stat_line[stat_line.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state), so utime (14) and stime (15) are at 11 and 12.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def parse_status_kib(status_text: str, key: str) -> int:
    """A `Key:   1234 kB` line of /proc/<pid>/status, in bytes."""
    for line in status_text.splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"{key} not in /proc status")


def sample(pid: int) -> ProcessSample:
    proc = Path("/proc") / str(pid)
    status = (proc / "status").read_text()
    return ProcessSample(
        cpu_s=parse_stat_cpu_s((proc / "stat").read_text()),
        rss_bytes=parse_status_kib(status, "VmRSS"),
        peak_rss_bytes=parse_status_kib(status, "VmHWM"),
    )


class Sampler(Periodic):
    """`sample(pid)` every `every_s` while a load runs (see `Periodic`): (seconds since start, sample)."""

    def __init__(self, pid: int, every_s: float, *, delay_s: float = 0.0, start: float | None = None) -> None:
        super().__init__(every_s, delay_s=delay_s, start=start)
        self.pid = pid
        self.samples: list[tuple[float, ProcessSample]] = []

    async def tick(self, at: float) -> None:
        self.samples.append((at, sample(self.pid)))
