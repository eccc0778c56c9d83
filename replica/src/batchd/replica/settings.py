"""How this process runs, as opposed to what it serves (that is the manifest's spec).

Read once at start-up from flags and `BATCHD_*` variables, then passed down; nothing below
reads the environment again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator

from batchd.api.environment import EnvironmentSettings
from batchd.api.pod import REPLICA_PORT


class ReplicaSettings(EnvironmentSettings):
    host: str = "127.0.0.1"
    port: int = Field(default=REPLICA_PORT, ge=0, le=65535)
    # Where `hf://org/name` sources resolve for clusters with no internet: <mirror>/org/name.
    model_mirror: Path | None = None
    # Where the operator mounts PVCs: `pvc://claim/path` -> <pvc_root>/claim/path.
    pvc_root: Path = Path("/models")
    # Bodies above this are refused with 413 before they are parsed (bytes).
    max_body_bytes: PositiveInt = 16 * 1024 * 1024
    # On SIGTERM: how long accepted requests get to finish before the process exits anyway (seconds).
    # The pod's terminationGracePeriodSeconds must be longer.
    drain_timeout_s: PositiveFloat = 60.0
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # How often the mounted manifest is read for live retuning (seconds); a stat and a small read.
    config_poll_s: PositiveFloat = 1.0

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("model_mirror", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: Any) -> Any:
        return None if value == "" else value
