"""How this process runs, as opposed to what it serves (that is the manifest's spec).

Read once at start-up from flags and the environment, then passed down; nothing below reads
the environment again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ReplicaSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    # Where `hf://org/name` sources resolve for clusters with no internet: <mirror>/org/name.
    model_mirror: Path | None = None
    # Where the operator mounts PVCs: `pvc://claim/path` -> <pvc_root>/claim/path.
    pvc_root: Path = Path("/models")
    # Bodies above this are refused with 413 before they are parsed (bytes).
    max_body_bytes: int = 16 * 1024 * 1024
    # On SIGTERM: how long accepted requests get to finish before the process exits anyway (seconds).
    # The pod's terminationGracePeriodSeconds must be longer.
    drain_timeout_s: float = 60.0
    log_level: str = "info"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **overrides: object) -> ReplicaSettings:
        """Settings from `BATCHD_*` variables; explicit overrides (command-line flags) win."""
        values: dict[str, object] = {}
        if mirror := environ.get("BATCHD_MODEL_MIRROR"):
            values["model_mirror"] = Path(mirror)
        if pvc_root := environ.get("BATCHD_PVC_ROOT"):
            values["pvc_root"] = Path(pvc_root)
        for name, variable, parse in (
            ("max_body_bytes", "BATCHD_MAX_BODY_BYTES", int),
            ("drain_timeout_s", "BATCHD_DRAIN_TIMEOUT_S", float),
        ):
            if raw := environ.get(variable):
                try:
                    values[name] = parse(raw)
                except ValueError:
                    raise ValueError(f"{variable}: expected a number, got {raw!r}") from None
        if level := environ.get("BATCHD_LOG_LEVEL"):
            values["log_level"] = level.lower()
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)  # type: ignore[arg-type]
