"""What every benchmark writes beside its figures: where, when and how it ran, as JSON with no NaN."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def machine() -> str:
    """The machine in a line: cores this process may use, CPU model, memory, OS."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    return f"{len(os.sched_getaffinity(0))} cores of {model}, {memory_gb:.0f} GB RAM, {platform.system()}"


def run_meta(module: str, argv: Sequence[str]) -> dict[str, Any]:
    """When, where and with what command a benchmark ran (`module` as `python -m` takes it)."""
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "command": shlex.join(["python", "-m", module, *argv]),
    }


def nan_to_none(value: Any) -> Any:
    """JSON has no NaN (nor infinity): missing figures are written as null."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [nan_to_none(v) for v in value]
    return value


def none_to_nan(value: Any) -> Any:
    """The other way, for reports rendered again from a .json: a null figure is NaN again."""
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {k: none_to_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [none_to_nan(v) for v in value]
    return value


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(nan_to_none(data), indent=2) + "\n")
