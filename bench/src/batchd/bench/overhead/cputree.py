"""CPU seconds of a process and all its descendants, from /proc: a server may be several processes
(Mosec runs its HTTP front in Rust and each model worker in a Python process of its own)."""

from __future__ import annotations

from pathlib import Path

from batchd.bench.kit.procstat import parse_stat_cpu_s

PROC = Path("/proc")


def parent_of(stat_line: str) -> int:
    """The parent pid (field 4) of a /proc/<pid>/stat line; the command name may hold spaces."""
    return int(stat_line[stat_line.rindex(")") + 2 :].split()[1])


def tree_cpu_s(pid: int) -> float:
    """User + system seconds of `pid` and every live descendant (threads are in their process)."""
    stats: dict[int, str] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = (entry / "stat").read_text()
            except OSError:  # gone meanwhile
                continue
    children: dict[int, list[int]] = {}
    for child, line in stats.items():
        children.setdefault(parent_of(line), []).append(child)
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        if current in stats:
            total += parse_stat_cpu_s(stats[current])
        pending.extend(children.get(current, ()))
    return total
