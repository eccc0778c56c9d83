"""What the demo serves and sends: one MiniLM replica, and the same embedding requests for both runs."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchd.bench.kit import loadgen
from batchd.testing import promtext, servers
from batchd.testing.manifests import manifest
from batchd.testing.models import MINILM_SOURCE

SENTENCES = [
    "Batching gathers independent requests into one call to the model.",
    "A replica waits at most ten milliseconds for a batch to fill.",
    "Kubernetes runs one pod for every replica of the deployment.",
    "The operator turns one custom resource into a Deployment and a Service.",
    "Sentence embeddings map text to vectors that can be compared.",
    "Prometheus scrapes the queue depth and the batch sizes of every replica.",
    "The quick brown fox jumps over the lazy dog.",
    "Throughput rises with the batch size until the model is the limit.",
]
PREDICT = "/v1/models/minilm:predict"


@dataclass(frozen=True)
class Outcome:
    """One server's run: what the clients saw, and the batches the server formed meanwhile."""

    label: str
    max_batch_size: int
    run: loadgen.RunResult
    batch_sizes: promtext.Histogram


def replica_manifest(name: str, max_batch_size: int, wait_s: float) -> dict[str, Any]:
    model = {"name": "minilm", "task": "feature-extraction", "source": MINILM_SOURCE, "device": "cpu"}
    return manifest(name, model, batching={"max_batch_size": max_batch_size, "batch_wait_timeout_s": wait_s})


def describe_answer(url: str) -> str:
    """One real answer, so the demo shows what the service returns, not only how fast."""
    body = json.dumps({"instances": [SENTENCES[0]]}).encode()
    request = urllib.request.Request(
        f"{url}{PREDICT}", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        prediction = json.loads(response.read())["predictions"][0]
    shape = []
    value: Any = prediction
    while isinstance(value, list):
        shape.append(len(value))
        value = value[0] if value else None
    return f"a {'x'.join(map(str, shape)) or 'scalar'} array of floats, starting {_head(prediction)}"


def _head(prediction: Any) -> str:
    flat = prediction
    while isinstance(flat, list) and flat and isinstance(flat[0], list):
        flat = flat[0]
    return "[" + ", ".join(f"{x:.4f}" for x in flat[:3]) + ", ...]"


def serve_and_load(
    label: str,
    max_batch_size: int,
    wait_s: float,
    workdir: Path,
    env: dict[str, str],
    total: int,
    concurrency: int,
) -> Outcome:
    """`batchd serve` with this batching, `total` requests from `concurrency` clients, then stopped."""
    path = servers.write_manifest(workdir, replica_manifest(f"minilm-{label}", max_batch_size, wait_s))
    server = servers.start_replica(path, workdir, env=env)
    print(f"  starting `batchd serve {path.name}` (max_batch_size {max_batch_size}) ...", flush=True)
    with servers.running([server], ready_timeout_s=300):
        if label == "batched":
            print(f"  one request answers {describe_answer(server.url)}", flush=True)
        requests = [
            loadgen.Request.post_json(
                server.host,
                server.port,
                PREDICT,
                json.dumps({"instances": [SENTENCES[i % len(SENTENCES)]]}).encode(),
            )
            for i in range(total)
        ]
        # A short warm-up, outside the measurement: first requests pay one-off allocations.
        loadgen.run(loadgen.fixed_count(server.host, server.port, requests[:concurrency], concurrency))
        before = server.metrics()
        run = loadgen.run(loadgen.fixed_count(server.host, server.port, requests, concurrency))
        batch_sizes = promtext.histogram_delta(server.metrics(), before, "batchd_batch_size")
    if run.errors:
        raise RuntimeError(f"{label}: {run.errors} of {total} requests failed, e.g. {run.error_samples[0]}")
    return Outcome(label, max_batch_size, run, batch_sizes)
