"""The demo (`make demo`), run as a user runs it: a real replica on loopback, with and without batching.

No timing is asserted: what is asserted is that the command works, that its output says what it
measured, and that a failure is reported, not hidden.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

RunModule = Callable[..., subprocess.CompletedProcess[str]]  # the run_module fixture (conftest.py)


@pytest.mark.slow
def test_demo_fails_loudly_when_the_replica_cannot_start(run_module: RunModule) -> None:
    # A setting the replica refuses at start-up: the demo must say so and exit non-zero.
    done = run_module(
        "batchd.bench.demo", "--requests", "8", env={"BATCHD_DRAIN_TIMEOUT_S": "soon"}, timeout_s=120
    )
    assert done.returncode == 1
    assert "demo failed: minilm-batched exited with status 2" in done.stderr
    assert (
        "BATCHD_DRAIN_TIMEOUT_S: Input should be a valid number" in done.stderr
        and "(got 'soon')" in done.stderr
    )


@pytest.mark.slow
def test_demo_serves_minilm_with_and_without_batching(run_module: RunModule) -> None:
    # Smoke-sized: the unbatched server gives every request, the warm-up's too, a forward pass of
    # its own; with a few, what is left of the time is the two replicas' start.
    done = run_module("batchd.bench.demo", "--requests", "8", "--concurrency", "4")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert "8 requests from 4 concurrent clients" in out
    assert "batched (max_batch_size 32)" in out
    assert "unbatched (max_batch_size 1)" in out
    assert "mean 1.0 (1:8)" in out  # the unbatched server formed only batches of one
    assert "Batching served" in out


def test_bad_options_are_refused_naming_the_option(run_module: RunModule) -> None:
    done = run_module("batchd.bench.demo", "--concurrency", "0", timeout_s=60)
    assert done.returncode == 2
    assert "--concurrency: expected 1 or more, got 0" in done.stderr
