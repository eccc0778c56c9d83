"""What peers.json holds, as frozen dataclasses (read back with `kit.records.from_json`): every
run of every peer, so that the report can be made again from the file."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from batchd.bench.kit.records import RunRecord


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
    rps: float = math.nan
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    cpu_ms_per_request: float = math.nan  # the whole server tree's CPU over the window
    cores_busy: float = math.nan  # that CPU over the window's length
    rss_mb: float = math.nan  # the tree's, at the end of the window
    pss_mb: float = math.nan
    processes: int = 0
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


@dataclass(frozen=True)
class Results:
    meta: RunRecord
    options: dict[str, Any]
    placement: str  # which cores the servers and the load generator had
    peers: list[PeerInfo]
    runs: list[Run]
    ceilings: list[CeilingRun]
