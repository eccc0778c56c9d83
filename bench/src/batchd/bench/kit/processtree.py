"""A server's whole process tree, read from /proc: its CPU seconds and its memory.

Mosec runs a Rust front and Python workers, Ray a driver, a GCS, a raylet, a proxy and replica
actors, BentoML an arbiter and workers: what a server costs is the sum over every process it
started, not its first one. A process that exits between two readings takes its CPU time with
it (unless its parent waited for it); the servers measured here keep their processes for the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from batchd.bench.kit import procstat

PROC = Path("/proc")


@dataclass(frozen=True)
class TreeSample:
    """CPU seconds of each process (by pid), and the tree's memory now."""

    cpu_s: Mapping[int, float]
    rss_bytes: int  # the sum of VmRSS: pages shared between processes count in each
    pss_bytes: int  # the sum of Pss: shared pages split between their processes

    @property
    def processes(self) -> int:
        return len(self.cpu_s)


def parent_of(stat_line: str) -> int:
    """The ppid (field 4) of a /proc/<pid>/stat line; the command name may hold spaces and parens."""
    return int(stat_line[stat_line.rindex(")") + 2 :].split()[1])


def descendants(root: int, parents: Mapping[int, int]) -> list[int]:
    """`root` and every process below it, given each process's parent."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def _parents() -> dict[int, int]:
    parents = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = parent_of((entry / "stat").read_text())
            except (OSError, ValueError):
                continue  # gone since the listing
    return parents


def pss_bytes(pid: int) -> int:
    """The process's proportional set size (0 where the kernel does not say)."""
    try:
        return procstat.parse_status_kib((PROC / str(pid) / "smaps_rollup").read_text(), "Pss")
    except (OSError, LookupError):
        return 0


def sample(root: int) -> TreeSample:
    """The tree under `root` now."""
    cpu: dict[int, float] = {}
    rss = pss = 0
    for pid in descendants(root, _parents()):
        try:
            one = procstat.sample(pid)
        except (OSError, LookupError, ValueError):
            continue  # exited, or a zombie with no memory left
        cpu[pid] = one.cpu_s
        rss += one.rss_bytes
        pss += pss_bytes(pid)
    return TreeSample(cpu, rss, pss)


def cpu_between(before: TreeSample, after: TreeSample) -> float:
    """CPU seconds the tree spent between two samples; a process born in between counts whole."""
    return sum(cpu - before.cpu_s.get(pid, 0.0) for pid, cpu in after.cpu_s.items())
