"""A replica's life as the kubelet sees it: not ready while loading, and SIGTERM loses nothing accepted."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchd.testing import ROOT, manifests
from batchd.testing.servers import (
    batchd_command,
    free_port,
    is_ready,
    replica_process,
    wait_until,
    write_manifest,
)

pytestmark = pytest.mark.slow


def inflight(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    match = re.search(r"^batchd_inflight_requests\{[^}]*\} (\S+)$", text, re.MULTILINE)
    assert match, "batchd_inflight_requests is not exported"
    return float(match.group(1))


async def test_sigterm_during_load_answers_every_accepted_request(tmp_path: Path) -> None:
    # Ray Serve's tutorial adder: 0.2 s a batch of at most 4, so 16 requests take about a second to serve.
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


def serve_until_exit(manifest_path: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`batchd serve` for a manifest it cannot serve: it must exit by itself, saying why."""
    command = [*batchd_command(), "serve", str(manifest_path), "--port", str(free_port())]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)


def test_a_bad_manifest_exits_2_with_the_field_named(tmp_path: Path) -> None:
    bad = write_manifest(tmp_path, manifests.manifest("bad", batching={"max_batch_size": 0}))
    result = serve_until_exit(bad, timeout_s=60)
    assert result.returncode == 2
    assert "spec.batching.max_batch_size" in result.stderr and "(got 0)" in result.stderr


def test_a_model_that_cannot_load_exits_3_and_says_why(tmp_path: Path) -> None:
    model = {"task": "feature-extraction", "source": "file:///nonexistent/model"}
    result = serve_until_exit(write_manifest(tmp_path, manifests.manifest("missing", model)), timeout_s=120)
    assert result.returncode == 3  # what the README promises, so that a pod's restarts say why
    assert "model.source" in result.stderr and "/nonexistent/model" in result.stderr


def test_live_at_once_ready_only_once_the_model_has_loaded() -> None:
    from batchd.api.manifest import parse_manifest
    from batchd.replica.front.app import create_app
    from batchd.replica.loading import load_model
    from batchd.replica.settings import ReplicaSettings
    from batchd.testing.servers import uvicorn_in_thread

    manifest = parse_manifest(manifests.manifest("slowload", "batchd.testing.batch_handlers:add_one"))
    release = threading.Event()

    def slow_load() -> Any:  # a model that takes as long as the test wants to load
        release.wait(timeout=60)
        return load_model(manifest.spec.model, mirror_dir=None, pvc_root=Path("/models"))

    app = create_app(manifest, ReplicaSettings(), load=slow_load)
    with uvicorn_in_thread(app, wait_ready=False) as url:
        assert httpx.get(f"{url}/v2/health/live").status_code == 200
        assert httpx.get(f"{url}/v2/health/ready").status_code == 503
        early = httpx.post(f"{url}/v1/models/slowload:predict", json={"instances": [1]})
        assert early.status_code == 503 and "still loading" in early.json()["error"]
        assert int(early.headers["retry-after"]) >= 1
        release.set()
        wait_until(lambda: is_ready(url), 30, "ready once loaded")
        assert httpx.post(f"{url}/v1/models/slowload:predict", json={"instances": [1]}).json() == {
            "predictions": [2]
        }


def test_a_hung_handler_answers_504_then_turns_unready_then_not_live(tmp_path: Path) -> None:
    document = manifests.manifest(
        "hung",
        "batchd.testing.batch_handlers:HangsOnZero",
        batching={"request_timeout_s": 1, "batch_wait_timeout_s": 0},
    )
    with replica_process(write_manifest(tmp_path, document), tmp_path) as replica:
        url = replica.url
        assert httpx.post(f"{url}/v1/models/hung:predict", json={"instances": [1]}).json() == {
            "predictions": [2]
        }
        started = time.monotonic()
        stuck = httpx.post(f"{url}/v1/models/hung:predict", json={"instances": [0]}, timeout=30)
        assert stuck.status_code == 504 and 0.9 < time.monotonic() - started < 5  # at request_timeout_s
        # The batch is still in the model: unready, and new work is refused at once, not queued.
        wait_until(lambda: httpx.get(f"{url}/v2/health/ready").status_code == 503, 10, "unready")
        refused = httpx.post(f"{url}/v1/models/hung:predict", json={"instances": [5]}, timeout=30)
        assert refused.status_code == 503 and "stuck on a batch" in refused.json()["error"]
        assert int(refused.headers["retry-after"]) >= 1
        assert httpx.get(f"{url}/v2/health/live").status_code == 200
        # Three request timeouts in, the liveness probe asks the kubelet for a restart.
        wait_until(lambda: httpx.get(f"{url}/v2/health/live").status_code == 503, 10, "not live")
        assert time.monotonic() - started >= 3


def test_sigterm_with_a_hung_batch_exits_within_the_drain_timeout(tmp_path: Path) -> None:
    document = manifests.manifest(
        "hung",
        "batchd.testing.batch_handlers:HangsOnZero",
        batching={"request_timeout_s": 1, "batch_wait_timeout_s": 0},
    )
    with replica_process(
        write_manifest(tmp_path, document), tmp_path, env={"BATCHD_DRAIN_TIMEOUT_S": "2"}
    ) as replica:
        assert (
            httpx.post(
                f"{replica.url}/v1/models/hung:predict", json={"instances": [0]}, timeout=30
            ).status_code
            == 504
        )
        started = time.monotonic()
        assert replica.terminate(timeout_s=30) == 1  # not 0: the batch was abandoned, and the log says so
        assert time.monotonic() - started < 10
        assert "still in the model after drain_timeout_s" in replica.log()
