"""Live retuning: a changed spec.batching in the mounted manifest reaches a running replica."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from batchd.api.manifest import parse_manifest
from batchd.api.spec import BATCHING_REVISION_ANNOTATION
from batchd.replica.front.app import create_app
from batchd.replica.retuning import NeedsRestart, batching_change
from batchd.replica.settings import ReplicaSettings
from batchd.testing.manifests import manifest
from batchd.testing.promtext import parse_counter, parse_histogram
from batchd.testing.servers import uvicorn_in_thread, wait_until, write_manifest

SLOW = "batchd.testing.batch_handlers:SlowAdder"


def reloads(url: str, outcome: str) -> float:
    """batchd_config_reloads_total of the replica at `url`, for one outcome."""
    return parse_counter(httpx.get(f"{url}/metrics").text, "batchd_config_reloads", {"outcome": outcome})


def replace(path: Path, text: str) -> None:
    """Change the file at once, as the kubelet updates a ConfigMap volume (an atomic swap): written
    in place, a poll could read it half written, count that as a change of its own, and then the
    whole text as another."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_text(text)
    staged.replace(path)


def with_generation(doc: dict[str, Any], generation: int) -> dict[str, Any]:
    doc["metadata"]["annotations"] = {BATCHING_REVISION_ANNOTATION: str(generation)}
    return doc


def test_only_a_batching_change_is_applied_live() -> None:
    base = parse_manifest(manifest("m", SLOW))
    retuned = parse_manifest(manifest("m", SLOW, batching={"max_batch_size": 4}))
    assert batching_change(base, retuned) == retuned.spec.batching
    assert batching_change(base, parse_manifest(manifest("m", SLOW))) is None
    with pytest.raises(NeedsRestart):
        batching_change(base, parse_manifest(manifest("m", "batchd.testing.batch_handlers:add_one")))
    newer = parse_manifest(with_generation(manifest("m", SLOW), 7))
    assert batching_change(base, newer) == newer.spec.batching  # same settings, a newer generation


def batch_sizes(url: str) -> tuple[float, float]:
    histogram = parse_histogram(httpx.get(f"{url}/metrics").text, "batchd_batch_size")
    return histogram.count, histogram.sum


async def burst(url: str, count: int) -> list[int]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        calls = [client.post("/v1/models/slow:predict", json={"instances": [n]}) for n in range(count)]
        return [response.status_code for response in await asyncio.gather(*calls)]


async def test_a_running_replica_batches_by_the_changed_file_without_a_restart(tmp_path: Path) -> None:
    first = with_generation(
        manifest("slow", SLOW, batching={"max_batch_size": 2, "batch_wait_timeout_s": 0.05}), 1
    )
    path = write_manifest(tmp_path, first)
    app = create_app(parse_manifest(first), ReplicaSettings(config_poll_s=0.05), manifest_path=path)
    with uvicorn_in_thread(app) as url:
        assert await burst(url, 8) == [200] * 8
        count, items = batch_sizes(url)
        assert items / count <= 2

        second = with_generation(
            manifest("slow", SLOW, batching={"max_batch_size": 8, "batch_wait_timeout_s": 0.1}), 2
        )
        replace(path, yaml.safe_dump(second))
        await asyncio.to_thread(
            wait_until,
            lambda: httpx.get(f"{url}/load").json()["batching_revision"] == 2,
            10,
            "generation 2",
        )
        before = batch_sizes(url)
        assert await burst(url, 8) == [200] * 8
        after = batch_sizes(url)
        assert after[1] - before[1] == 8 and after[0] - before[0] < 4  # batches of more than two now
        metadata = httpx.get(f"{url}/v2/models/slow").json()
        assert metadata["parameters"] == {"batching_revision": 2}
        assert (
            'batchd_batching_revision{deployment="slow",model="slow"} 2.0' in httpx.get(f"{url}/metrics").text
        )

        # A broken file and a model change are refused; the replica keeps serving as it was.
        replace(path, "spec: [not, a, manifest")
        await asyncio.to_thread(
            wait_until,
            lambda: reloads(url, "invalid") == 1,
            10,
            "the invalid file noticed",
        )
        replace(
            path,
            yaml.safe_dump(with_generation(manifest("slow", "batchd.testing.batch_handlers:add_one"), 3)),
        )
        await asyncio.to_thread(
            wait_until,
            lambda: reloads(url, "needs_restart") == 1,
            10,
            "the model change noticed",
        )
        assert await burst(url, 2) == [200, 200]
        assert httpx.get(f"{url}/load").json()["batching_revision"] == 2
