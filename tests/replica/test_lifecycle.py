"""A replica's life as the kubelet sees it: not ready while loading, and SIGTERM loses nothing accepted."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.servers import ROOT, free_port, is_ready, replica_process, wait_until

pytestmark = pytest.mark.slow


def inflight(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    match = re.search(r"^batchd_inflight_requests\{[^}]*\} (\S+)$", text, re.MULTILINE)
    assert match, "batchd_inflight_requests is not exported"
    return float(match.group(1))


async def test_sigterm_during_load_answers_every_accepted_request(tmp_path: Path) -> None:
    # The seeds' adder: 0.2 s a batch of at most 4, so 16 requests take about a second to serve.
    with replica_process(ROOT / "examples" / "adder.yaml", tmp_path) as replica:
        async with httpx.AsyncClient(base_url=replica.url, timeout=60) as client:
            calls = [
                asyncio.ensure_future(client.post("/v1/models/adder:predict", json={"instances": [n]}))
                for n in range(16)
            ]
            await asyncio.to_thread(
                wait_until, lambda: inflight(replica.url) >= 16, 30, "16 requests accepted"
            )
            replica.process.send_signal(signal.SIGTERM)
            responses = await asyncio.gather(*calls)
        assert [r.status_code for r in responses] == [200] * 16
        assert [r.json()["predictions"][0] for r in responses] == [n + 1 for n in range(16)]
        assert replica.process.wait(timeout=60) == 0
        # Once it stopped, nothing more is admitted.
        with pytest.raises(httpx.ConnectError):
            httpx.post(f"{replica.url}/v1/models/adder:predict", json={"instances": [1]}, timeout=5)
        assert "Traceback" not in replica.log()


def test_a_bad_manifest_exits_2_with_the_field_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: serving.batchd.dev/v1alpha1\nkind: BatchedDeployment\nmetadata: {name: bad}\n"
        "spec:\n  model: {handler: examples.adder:BatchAdder.handle_batch}\n  batching: {max_batch_size: 0}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "batchd.replica.cli", "serve", str(bad), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert "spec.batching.max_batch_size" in result.stderr and "(got 0)" in result.stderr


def test_a_model_that_cannot_load_exits_non_zero_and_says_why(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    missing.write_text(
        "apiVersion: serving.batchd.dev/v1alpha1\nkind: BatchedDeployment\nmetadata: {name: missing}\n"
        "spec:\n  model: {task: feature-extraction, source: 'file:///nonexistent/model'}\n"
    )
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "batchd.replica.cli", "serve", str(missing), "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode != 0
    assert "/nonexistent/model" in result.stdout + result.stderr
    assert not is_ready(f"http://127.0.0.1:{port}")
