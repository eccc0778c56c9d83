"""What the benchmarks' tests share: running a benchmark's command as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from batchd.bench.kit import CHECKOUT

RunModule = Callable[..., subprocess.CompletedProcess[str]]


def _run_module(
    module: str, *args: str, env: dict[str, str] | None = None, timeout_s: float = 280
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def run_module() -> RunModule:
    """`python -m MODULE ARGS...` from the checkout, its output captured (env= adds variables)."""
    return _run_module
