"""The harness: for each scenario, the ceiling, then the floor and batchd (batched and unbatched)
under the same loads, interleaved and repeated, with the server's own metrics read around each run.

The machine is small and shared, so nothing is measured once: every (server, load) point runs
`repeats` times, the servers take turns within each repeat (a slow minute hurts all of them
alike), and the report quotes medians.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from batchd.bench.kit import floor, loadgen, procstat, promtext
from batchd.bench.kit.repeats import rotated
from batchd.bench.kit.stats import LatencySummary, median
from batchd.bench.scenarios import analysis, catalog, results
from batchd.testing import servers

logger = logging.getLogger("batchd.bench")

MB = 1024 * 1024


@dataclass(frozen=True)
class Options:
    scenarios: tuple[str, ...] = ("trivial", "minilm", "gpt2")
    repeats: int = 3
    duration_s: float = 3.0
    warmup_s: float = 0.5
    concurrencies: tuple[int, ...] = (1, 8, 32, 128)
    open_loop: bool = True
    # The open-loop rate, as a share of batched batchd's closed-loop throughput at 32 clients.
    open_loop_load: float = 0.7
    ceiling_duration_s: float = 3.0
    subjects: tuple[str, ...] = ("floor", "batched", "unbatched")


class Ceiling:
    """The model alone, in a child process pinned like the server, measured once per repeat."""

    def __init__(
        self,
        scenario: catalog.Scenario,
        assets: Path,
        env: dict[str, str],
        manifest: Path,
        options: Options,
        log_dir: Path,
    ) -> None:
        cores = scenario.server_cores or os.sched_getaffinity(0)
        command = [
            sys.executable, "-m", "batchd.bench.scenarios.ceiling", str(scenario.ceiling_kind),
            "--model-dir", str(catalog.model_dir(scenario, assets)),
            "--item", json.dumps(scenario.item),
            "--batch-sizes", "1", str(scenario.max_batch_size),
            "--threads", env.get("OMP_NUM_THREADS", str(len(cores))),
            "--duration-s", str(options.ceiling_duration_s),
            "--call-kwargs", json.dumps(scenario.call_kwargs),
            "--manifest", str(manifest),
            "--on-request",
        ]  # fmt: skip
        if "BATCHD_MODEL_MIRROR" in env:
            command += ["--mirror", env["BATCHD_MODEL_MIRROR"]]
        self.log_path = log_dir / f"ceiling-{scenario.name}.log"
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                env={**os.environ, **env}, preexec_fn=lambda: os.sched_setaffinity(0, cores),
            )  # fmt: skip
        self._read()  # {"loaded": true} once the model is in memory
        self.runs: list[dict[str, Any]] = []

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the ceiling process exited with {self.process.wait()}:\n{tail}")
        return json.loads(line)  # type: ignore[no-any-return]

    def measure(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        self.runs.append(self._read())

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def summary(self) -> results.CeilingSummary:
        """Median items/s per (kind, batch size) over the repeats; the runs are kept too."""
        first = self.runs[0]

        def entries(kind: str) -> list[results.CeilingEntry]:
            return [
                results.CeilingEntry(
                    batch_size=entry["batch_size"],
                    items_per_s=median([run[kind][i]["items_per_s"] for run in self.runs]),
                    best_items_per_s=max(run[kind][i]["items_per_s"] for run in self.runs),
                    batch_latency_ms=median([run[kind][i]["batch_latency_ms"] for run in self.runs]),
                )
                for i, entry in enumerate(first.get(kind, []))
            ]

        return results.CeilingSummary(
            first["threads"], entries("raw"), entries("replica"), self.runs, first.get("replica_error")
        )


def measure_point(
    server: servers.ServerProcess,
    scenario: catalog.Scenario,
    mode: str,
    concurrency: int,
    rate_rps: float | None,
    options: Options,
) -> results.PointRun:
    """One load run against one server, with /metrics and /proc read before and after."""
    request = loadgen.Request.post_json(server.host, server.port, scenario.path, scenario.body())
    is_replica = server.name != "floor"
    metrics_before = server.metrics() if is_replica else ""
    before = procstat.sample(server.pid)
    if mode == "closed":
        load = loadgen.closed_loop(
            server.host, server.port, request, concurrency, options.duration_s, options.warmup_s
        )
    else:
        assert rate_rps is not None
        load = loadgen.open_loop(server.host, server.port, request, rate_rps, options.duration_s)
    harness_cores = os.sched_getaffinity(0)
    if scenario.client_cores:
        os.sched_setaffinity(0, scenario.client_cores)
    try:
        result = loadgen.run(load)
    finally:
        os.sched_setaffinity(0, harness_cores)
    after = procstat.sample(server.pid)
    server.check_alive()
    latency = LatencySummary.of(result.latencies_s)
    sizes = (
        promtext.histogram_delta(server.metrics(), metrics_before, "batchd_batch_size")
        if is_replica
        else None
    )
    run = results.PointRun(
        throughput_rps=result.throughput_rps,
        p50_ms=latency.p50_ms,
        p95_ms=latency.p95_ms,
        p99_ms=latency.p99_ms,
        completed=result.completed,
        errors=result.errors,
        error_samples=result.error_samples,
        duration_s=result.duration_s,
        client_cpu_s=result.client_cpu_s,
        server_cpu_s=after.cpu_s - before.cpu_s,
        server_cpu_share=(after.cpu_s - before.cpu_s)
        / (result.duration_s + (options.warmup_s if mode == "closed" else 0)),
        server_peak_rss_mb=after.peak_rss_bytes / MB,
        batch_sizes=sizes.distribution() if sizes else {},
        batches=sizes.count if sizes else 0.0,
        batched_items=sizes.sum if sizes else 0.0,
    )
    if result.errors:
        logger.warning(
            "%s %s c=%s: %d errors, e.g. %s",
            server.name,
            mode,
            concurrency,
            result.errors,
            result.error_samples[:1],
        )
    return run


def run_scenario(scenario: catalog.Scenario, options: Options, workdir: Path) -> results.ScenarioResult:
    assets = workdir / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    logger.info("[%s] preparing the model", scenario.name)
    env = catalog.prepare_assets(scenario, assets)
    manifests = {
        kind: servers.write_manifest(workdir, scenario.manifest(assets, batched=(kind == "batched")))
        for kind in ("batched", "unbatched")
    }
    ceiling: Ceiling | None = None
    if scenario.ceiling_kind is not None:
        logger.info("[%s] loading the model alone, for the ceiling", scenario.name)
        ceiling = Ceiling(scenario, assets, env, manifests["batched"], options, logs)

    started: dict[str, servers.ServerProcess] = {}
    for subject in options.subjects:
        if subject == "floor":
            started[subject] = floor.start(logs, cores=scenario.server_cores)
        else:
            started[subject] = servers.start_replica(
                manifests[subject], logs, env=env, cores=scenario.server_cores
            )
    idle_rss_mb: dict[str, float] = {}
    peak_rss_mb: dict[str, float] = {}
    repeats: dict[tuple[str, str, int, float | None], list[results.PointRun]] = {}
    open_rate: float | None = None
    with contextlib.ExitStack() as stack:
        if ceiling is not None:
            stack.callback(ceiling.close)
        stack.enter_context(servers.running(list(started.values())))
        for name, server in started.items():
            idle_rss_mb[name] = procstat.sample(server.pid).rss_bytes / MB
        answers = {name: _answer(server, scenario) for name, server in started.items() if name != "floor"}
        for repeat in range(options.repeats):
            order = rotated(list(started), repeat)
            if ceiling is not None:
                logger.info(
                    "[%s] repeat %d: the ceiling (the model alone, in-process)", scenario.name, repeat + 1
                )
                ceiling.measure()
            for mode, concurrency in [("closed", c) for c in options.concurrencies]:
                for name in order:
                    logger.info(
                        "[%s] repeat %d: %s, %s loop, %d clients",
                        scenario.name,
                        repeat + 1,
                        name,
                        mode,
                        concurrency,
                    )
                    run = measure_point(started[name], scenario, mode, concurrency, None, options)
                    repeats.setdefault((name, mode, concurrency, None), []).append(run)
            if options.open_loop and "batched" in started:
                if open_rate is None:
                    reference = max(options.concurrencies, key=lambda c: (c <= 32, c))
                    measured = repeats[("batched", "closed", reference, None)][0].throughput_rps
                    open_rate = max(1.0, round(measured * options.open_loop_load))
                for name in order:
                    logger.info(
                        "[%s] repeat %d: %s, open loop, %.0f req/s",
                        scenario.name,
                        repeat + 1,
                        name,
                        open_rate,
                    )
                    run = measure_point(started[name], scenario, "open", 0, open_rate, options)
                    repeats.setdefault((name, "open", 0, open_rate), []).append(run)
        for name, server in started.items():
            peak_rss_mb[name] = procstat.sample(server.pid).peak_rss_bytes / MB
    subjects = {
        name: results.SubjectFigures(
            idle_rss_mb[name], peak_rss_mb.get(name, math.nan), server.process.returncode
        )
        for name, server in started.items()
    }

    order_of = {name: index for index, name in enumerate(options.subjects)}
    points = [
        results.Point(name, mode, c, rate, analysis.summarise_point(runs), runs)
        for (name, mode, c, rate), runs in sorted(
            repeats.items(), key=lambda kv: (order_of[kv[0][0]], kv[0][1], kv[0][2])
        )
    ]
    summary = ceiling.summary() if ceiling is not None else None
    return results.ScenarioResult(
        title=scenario.title,
        max_batch_size=scenario.max_batch_size,
        batch_wait_timeout_s=scenario.batch_wait_timeout_s,
        server_cores=sorted(scenario.server_cores) if scenario.server_cores else None,
        client_cores=sorted(scenario.client_cores) if scenario.client_cores else None,
        open_loop_rate_rps=open_rate,
        ceiling=summary,
        same_work=same_work(ceiling, answers) if ceiling is not None else None,
        subjects=subjects,
        points=points,
        ratios=analysis.compute_ratios(points, summary),
        ratios_best=analysis.compute_ratios(points, summary, "best_throughput_rps"),
    )


def _answer(server: servers.ServerProcess, scenario: catalog.Scenario) -> Any:
    """What a server answers for the scenario's item (one request, before any load)."""
    response = httpx.post(f"{server.url}{scenario.path}", content=scenario.body(), timeout=120)
    response.raise_for_status()
    return response.json()["predictions"][0]


def same_work(ceiling: Ceiling, answers: dict[str, Any]) -> dict[str, bool]:
    """Whether the ceiling and the servers did the same work: the same answer for the same item
    (for text generation: the same tokens). A server above its ceiling means little otherwise."""
    reference = ceiling.runs[0]["answers"].get("raw") if ceiling.runs else None
    result = {name: answer == reference for name, answer in answers.items()}
    if "replica" in ceiling.runs[0]["answers"]:
        result["replica_model_layer"] = ceiling.runs[0]["answers"]["replica"] == reference
    result["all"] = all(result.values())
    if not result["all"]:
        logger.warning("the ceiling and the servers answered differently: %s", result)
    return result
