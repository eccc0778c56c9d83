"""Operator benchmark: how fast a BatchedDeployment gets its Deployment, how fast 500 converge, how
much memory the operator uses, and what autoscaling 500 resources of 4 replicas costs it. Not a
test: it prints figures (and writes them to bench/results/operator.{json,md}).

    python -m batchd.bench.operator_bench [--repeats 20] [--resources 500] [--autoscaled 500]

The operator runs as a user runs it (`python -m batchd.operator`, its own process, so its CPU and
RSS are its own) against the emulated API server of the tests (`batchd.testing.apiserver`) in this
process. Custom resources still pass the CRD's admission; the children's validation against
the Kubernetes schemas is switched off, so the figures time the operator, not the validator.

Autoscaling: 2,000 real replica processes cannot run here, so the benchmark makes the replica
pods itself (labelled as the operator's Deployment labels them, Ready, each with its own
127.200.x.y address and a container port 8000 named http) and one lightweight stand-in server, in
a process of its own, answers `GET /load` on every one of those addresses with a small, slowly
varying load. Those stand-in load endpoints cost next to nothing, so the figure is the operator's
own cost of polling every replica at its default interval and writing what it saw. With
min_replicas = max_replicas = 4 no Deployment is ever scaled: what is measured is the steady
cost of watching, which is what a large, quiet installation pays all day.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import math
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

from batchd.api.pod import MANAGED_BY, REPLICA_PORT
from batchd.bench import RESULTS_DIR, records
from batchd.operator.settings import Settings
from batchd.testing import procstat
from batchd.testing.apiserver import ApiServer
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import api_server, create, operator_process, patch

NS = "default"
DEFAULT_POLL_S = float(Settings.model_fields["replica_poll_interval_s"].default)
STATUS_WRITE = ("serving.batchd.dev", "batcheddeployments/status", "patch")


def _rss_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process, in MiB."""
    sample = procstat.sample(pid)
    return sample.rss_bytes / 2**20, sample.peak_rss_bytes / 2**20


async def until(probe: Any, timeout_s: float, what: str, interval_s: float = 0.002) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if probe():
            return time.perf_counter() - started
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"{what} did not happen within {timeout_s}s")


def _converged(server: ApiServer, name: str) -> bool:
    resource = server.get_object("serving.batchd.dev/batcheddeployments", NS, name) or {}
    status = resource.get("status") or {}
    return bool(
        status.get("observed_generation") == resource.get("metadata", {}).get("generation")
        and server.get_object("apps/deployments", NS, name)
        and server.get_object("services", NS, name)
    )


async def run(repeats: int, resources: int, log: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            api_server(Path(tmp), validate_children=False) as server,
            operator_process(server, log) as operator,
        ):
            pid = operator.pid
            _, idle_peak = _rss_mib(pid)

            latencies = []
            for index in range(repeats):
                name = f"latency-{index}"
                started = time.perf_counter()
                await create(server, manifest(name))
                await until(
                    lambda name=name: server.get_object("apps/deployments", NS, name),
                    30,
                    f"Deployment {name}",
                )
                latencies.append(time.perf_counter() - started)

            cpu_before = procstat.sample(pid).cpu_s
            started = time.perf_counter()
            names = [f"bulk-{index:04d}" for index in range(resources)]
            for name in names:
                await create(server, manifest(name))
            created_s = time.perf_counter() - started
            await until(
                lambda: all(_converged(server, name) for name in names),
                600,
                f"{resources} resources converging",
                interval_s=0.05,
            )
            converge_s = time.perf_counter() - started
            operator_cpu_s = procstat.sample(pid).cpu_s - cpu_before
            rss, peak = _rss_mib(pid)
    return {
        "create_to_deployment_median_ms": statistics.median(latencies) * 1000,
        "create_to_deployment_p90_ms": statistics.quantiles(latencies, n=10)[-1] * 1000
        if repeats >= 2
        else 0,
        "bulk_resources": resources,
        "bulk_create_s": created_s,
        "bulk_converge_s": converge_s,
        "bulk_per_second": resources / converge_s,
        "bulk_operator_cpu_s": operator_cpu_s,
        "operator_rss_idle_peak_mib": idle_peak,
        "operator_rss_after_bulk_mib": rss,
        "operator_rss_peak_mib": peak,
    }


# -- autoscaling: the steady cost of polling every replica -------------------------------------------


def replica_ip(index: int) -> str:
    """The stand-in pod addresses: 127.200.0.1 upwards, far from the stand-in cluster's 127.0.x.y."""
    return f"127.200.{index // 250}.{index % 250 + 1}"


def stand_in_load(address: str, now: float) -> tuple[int, int]:
    """(queued, running) items a replica at `address` reports at `now`: each replica its own base
    load (0-11 items), moving +-30% over two minutes, so that some polls change a resource's total
    by more than the operator's 10% write threshold and others do not."""
    seed = zlib.crc32(address.encode())
    base = seed % 12
    items = round(base * (1 + 0.3 * math.sin(2 * math.pi * now / 120 + seed % 628 / 100)))
    running = min(items, 8)
    return items - running, running


class _LoadEndpoints(asyncio.Protocol):
    """One connection to a stand-in replica: HTTP/1.1 keep-alive GETs, answered from memory."""

    # (wall time, address) of every GET /load, for the report: one list for every connection.
    polls: ClassVar[list[tuple[float, str]]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's, which does not subclass asyncio's
        self.address = str(transport.get_extra_info("sockname")[0])  # which "pod" was asked
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            if path == b"/load":
                now = time.time()
                self.polls.append((now, self.address))
                queued, running = stand_in_load(self.address, now)
                body = json.dumps(
                    {
                        "ready": True,
                        "queued_items": queued,
                        "running_items": running,
                        "inflight_requests": queued + running,
                        "batching_generation": 1,  # a new resource's generation, as its replicas run it
                    }
                ).encode()
            elif path == b"/polls":  # the benchmark's own question: every poll so far
                body = json.dumps(self.polls).encode()
            else:
                body = b"{}"
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )


def serve_loads(count: int, port: int = REPLICA_PORT) -> None:
    """Answer `GET /load` on the first `count` stand-in addresses until killed (its own process)."""
    import uvloop

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        hosts = [replica_ip(index) for index in range(count)]
        server = await loop.create_server(_LoadEndpoints, host=hosts, port=port, backlog=1024)
        print("listening", flush=True)
        async with server:
            await server.serve_forever()

    uvloop.run(serve())


@contextlib.asynccontextmanager
async def _load_server(count: int, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    code = f"from batchd.bench.operator_bench import serve_loads; serve_loads({count})"
    with log.open("w") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=stderr
        )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        if line.strip() != b"listening":
            raise RuntimeError(f"the stand-in load endpoints did not start; see {log}")
        yield process
    finally:
        process.kill()
        await process.wait()


async def _polls_seen() -> list[tuple[float, str]]:
    reader, writer = await asyncio.open_connection(replica_ip(0), REPLICA_PORT)
    try:
        writer.write(f"GET /polls HTTP/1.1\r\nHost: {replica_ip(0)}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return [(t, address) for t, address in json.loads(await reader.readexactly(length))]
    finally:
        writer.close()


def replica_pod(bd: str, index: int, address: str) -> dict[str, Any]:
    """A replica pod as the operator's Deployment would have it made (what the operator reads of it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{bd}-stand-in-{index}",
            "labels": {
                **MANAGED_BY,
                "app.kubernetes.io/component": "replica",
                "app.kubernetes.io/instance": bd,
            },
        },
        "spec": {
            "containers": [
                {"name": "replica", "image": "stand-in", "ports": [{"name": "http", "containerPort": 8000}]}
            ]
        },
    }


def ready_status(address: str) -> dict[str, Any]:
    return {
        "status": {
            "phase": "Running",
            "podIP": address,
            "podIPs": [{"ip": address}],
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
            ],
        }
    }


async def _in_chunks(calls: Sequence[Any], size: int = 50) -> None:
    for offset in range(0, len(calls), size):
        await asyncio.gather(*(call() for call in calls[offset : offset + size]))


def _cycles(times: Sequence[float], poll_s: float) -> list[tuple[float, float, int]]:
    """The operator's rounds of polls, as (first, last, polls): a pause of a quarter interval
    separates two rounds (a round that took longer than that would merge with the next)."""
    rounds: list[tuple[float, float, int]] = []
    for t in sorted(times):
        if rounds and t - rounds[-1][1] < poll_s / 4:
            first, _, count = rounds[-1]
            rounds[-1] = (first, t, count + 1)
        else:
            rounds.append((t, t, 1))
    return rounds


async def run_autoscaling(
    resources: int, replicas_per: int, steady_s: float, window_s: float, poll_s: float | None, log: Path
) -> dict[str, Any]:
    """The operator polls `resources` x `replicas_per` stand-in replicas; its CPU and memory in
    windows of `window_s` over `steady_s` once every replica has been polled."""
    interval_s = poll_s or DEFAULT_POLL_S
    total = resources * replicas_per
    env = {"BATCHD_REPLICA_POLL_INTERVAL_S": str(poll_s)} if poll_s else {}
    autoscaling = {"min_replicas": replicas_per, "max_replicas": replicas_per}
    names = [f"auto-{index:04d}" for index in range(resources)]
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            api_server(Path(tmp), validate_children=False) as server,
            _load_server(total, log.with_suffix(".loads.log")) as loads,
            operator_process(server, log.with_suffix(".autoscaling.log"), env) as operator,
        ):
            pid = operator.pid
            started = time.perf_counter()
            await _in_chunks(
                [
                    lambda name=name: create(
                        server, manifest(name, num_replicas=replicas_per, autoscaling=autoscaling)
                    )
                    for name in names
                ]
            )
            pods_path = f"/api/v1/namespaces/{NS}/pods"

            async def make_pod(bd: str, index: int, address: str) -> None:
                response = await server.post(pods_path, json=replica_pod(bd, index, address))
                assert response.status == 201, await response.text()
                await patch(server, f"{pods_path}/{bd}-stand-in-{index}/status", ready_status(address))

            await _in_chunks(
                [
                    lambda bd=bd, index=index, at=number * replicas_per + index: make_pod(
                        bd, index, replica_ip(at)
                    )
                    for number, bd in enumerate(names)
                    for index in range(replicas_per)
                ]
            )
            await until(
                lambda: all(_converged(server, name) for name in names),
                600,
                f"{resources} resources converging",
                interval_s=0.1,
            )
            setup_s = time.perf_counter() - started
            # Every replica polled once, and one more quiet interval: the creation burst is over.
            while len({address for _, address in await _polls_seen()}) < total:
                if time.perf_counter() - started > 600:
                    raise TimeoutError("the operator did not poll every replica within 600 s")
                await asyncio.sleep(interval_s)
            await asyncio.sleep(interval_s * 2)

            windows: list[dict[str, Any]] = []
            calls_before = len(server.calls)
            last = (
                time.time(),
                procstat.sample(pid).cpu_s,
                procstat.sample(loads.pid).cpu_s,
                len(server.calls),
            )
            steady_from = last[0]
            while time.time() < steady_from + steady_s:
                await asyncio.sleep(window_s)
                now = (
                    time.time(),
                    procstat.sample(pid).cpu_s,
                    procstat.sample(loads.pid).cpu_s,
                    len(server.calls),
                )
                calls = server.calls[last[3] : now[3]]
                windows.append(
                    {
                        "from": last[0],
                        "to": now[0],
                        "operator_cores": (now[1] - last[1]) / (now[0] - last[0]),
                        "load_endpoints_cores": (now[2] - last[2]) / (now[0] - last[0]),
                        "status_writes": sum(call == STATUS_WRITE for call in calls),
                        # Kopf lists everything again each time a watch stream ends and restarts.
                        "watch_restarts": sum(call[2] == "watch" for call in calls),
                    }
                )
                last = now
            rss, peak = _rss_mib(pid)
            steady_calls = collections.Counter("/".join(call) for call in server.calls[calls_before:])
            polls = await _polls_seen()

    steady_to = windows[-1]["to"]
    steady = [(t, address) for t, address in polls if steady_from <= t < steady_to]
    for window in windows:
        inside = [address for t, address in steady if window["from"] <= t < window["to"]]
        window["polls_per_s"] = len(inside) / (window["to"] - window["from"])
        window["replicas_polled"] = len(set(inside))
    per_replica = collections.Counter(address for _, address in steady)
    rounds = _cycles([t for t, _ in steady], interval_s)[1:-1]  # the first and last may be cut off
    duration_s = steady_to - steady_from
    return {
        "resources": resources,
        "replicas": total,
        "poll_interval_s": interval_s,
        "setup_s": setup_s,
        "steady_s": duration_s,
        "windows": windows,
        "operator_cores_median": statistics.median(w["operator_cores"] for w in windows),
        "operator_cores_max": max(w["operator_cores"] for w in windows),
        "operator_cores_mean": statistics.fmean(w["operator_cores"] for w in windows),
        "load_endpoints_cores_median": statistics.median(w["load_endpoints_cores"] for w in windows),
        "operator_rss_mib": rss,
        "operator_rss_peak_mib": peak,
        "polls_per_s": len(steady) / duration_s,
        "expected_polls_per_s": total / interval_s,
        "replicas_polled": len(per_replica),
        "polls_per_replica_min": min(per_replica.values(), default=0),
        "polls_per_replica_max": max(per_replica.values(), default=0),
        "expected_polls_per_replica": duration_s / interval_s,
        "rounds": len(rounds),
        "round_spread_ms_median": statistics.median((last - first) * 1000 for first, last, _ in rounds)
        if rounds
        else math.nan,
        "round_period_s_median": statistics.median(b[0] - a[0] for a, b in itertools.pairwise(rounds))
        if len(rounds) > 1
        else math.nan,
        "status_writes": sum(w["status_writes"] for w in windows),
        "status_writes_per_s": sum(w["status_writes"] for w in windows) / duration_s,
        "operator_calls": dict(sorted(steady_calls.items())),
    }


# -- the report --------------------------------------------------------------------------------------


def report_lines(figures: dict[str, Any], repeats: int, resources: int) -> list[str]:
    lines = [
        f"create -> Deployment: median {figures['create_to_deployment_median_ms']:.1f} ms, "
        f"p90 {figures['create_to_deployment_p90_ms']:.1f} ms over {repeats} creates",
        f"{resources} resources: created in {figures['bulk_create_s']:.1f} s, all converged "
        f"(children + status) after {figures['bulk_converge_s']:.1f} s "
        f"({figures['bulk_per_second']:.1f} resources/s; the operator used "
        f"{figures['bulk_operator_cpu_s']:.1f} s of CPU in that time)",
        f"operator RSS: {figures['operator_rss_idle_peak_mib']:.0f} MiB idle, "
        f"{figures['operator_rss_after_bulk_mib']:.0f} MiB with {resources + repeats} resources "
        f"(peak {figures['operator_rss_peak_mib']:.0f} MiB)",
    ]
    auto = figures.get("autoscaling")
    if auto:
        cores = ", ".join(f"{w['operator_cores']:.3f}" for w in auto["windows"])
        lines += [
            f"autoscaling {auto['resources']} resources x {auto['replicas'] // max(auto['resources'], 1)} "
            f"replicas ({auto['replicas']} stand-in /load endpoints, one lightweight process: the "
            f"figures are the operator's own cost), polled every {auto['poll_interval_s']:g} s, "
            f"{auto['steady_s']:.0f} s of steady state:",
            f"  operator CPU: {auto['operator_cores_median']:.3f} cores (median of {len(auto['windows'])} "
            f"windows: {cores}; mean {auto['operator_cores_mean']:.3f}); the stand-in endpoints used "
            f"{auto['load_endpoints_cores_median']:.3f} cores",
            f"  operator RSS: {auto['operator_rss_mib']:.0f} MiB "
            f"(peak {auto['operator_rss_peak_mib']:.0f} MiB)",
            f"  polls: {auto['polls_per_s']:.1f}/s (expected {auto['expected_polls_per_s']:.1f}/s); "
            f"{auto['replicas_polled']} of {auto['replicas']} replicas polled, "
            f"{auto['polls_per_replica_min']}-{auto['polls_per_replica_max']} times each "
            f"(expected {auto['expected_polls_per_replica']:.1f})",
            f"  one round of polls spans {auto['round_spread_ms_median']:.0f} ms (median of "
            f"{auto['rounds']} rounds), rounds start every {auto['round_period_s_median']:.2f} s",
            f"  status writes: {auto['status_writes']} ({auto['status_writes_per_s']:.1f}/s); "
            f"operator API calls in steady state: {auto['operator_calls']}",
        ]
    return lines


def to_markdown(figures: dict[str, Any], repeats: int, resources: int, meta: dict[str, str]) -> str:
    lines = [
        "# Operator benchmark",
        "",
        f"`{meta['command']}` ({meta['date']}, {meta['machine']})",
        "",
        "The operator in its own process (`python -m batchd.operator`) against the emulated API server.",
        "",
        *(
            f"  - {line.strip()}" if line.startswith("  ") else f"- {line}"
            for line in report_lines(figures, repeats, resources)
        ),
    ]
    auto = figures.get("autoscaling")
    if auto:
        lines += [
            "",
            "Autoscaling steady state, window by window:",
            "",
            "| window | operator cores | polls/s | replicas polled | status writes | watches restarted "
            "| stand-in endpoints cores |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for number, window in enumerate(auto["windows"], 1):
            lines.append(
                f"| {number} ({window['to'] - window['from']:.1f} s) | {window['operator_cores']:.3f} "
                f"| {window['polls_per_s']:.1f} | {window['replicas_polled']} | {window['status_writes']} "
                f"| {window['watch_restarts']} | {window['load_endpoints_cores']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="single creates timed one after another")
    parser.add_argument("--resources", type=int, default=500, help="resources created at once to converge")
    parser.add_argument(
        "--autoscaled", type=int, default=500, help="autoscaled resources whose replicas are polled; 0 = skip"
    )
    parser.add_argument("--replicas-per", type=int, default=4, help="replicas of each autoscaled resource")
    parser.add_argument("--steady-s", type=float, default=60, help="seconds of autoscaling steady state")
    parser.add_argument("--window-s", type=float, default=10, help="CPU is measured in windows this long")
    parser.add_argument(
        "--poll-interval-s",
        type=float,
        default=None,
        help=f"the operator's replica poll interval (default: its own, {DEFAULT_POLL_S:g} s)",
    )
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR, help="operator.json and .md go here")
    parser.add_argument(
        "--log",
        type=Path,
        default=Path(tempfile.gettempdir()) / "batchd-operator-bench.log",
        help="where the operator's own log goes",
    )
    args = parser.parse_args(argv)
    figures: dict[str, Any] = asyncio.run(run(args.repeats, args.resources, args.log))
    if args.autoscaled:
        figures["autoscaling"] = asyncio.run(
            run_autoscaling(
                args.autoscaled,
                args.replicas_per,
                args.steady_s,
                args.window_s,
                args.poll_interval_s,
                args.log,
            )
        )
    meta = records.run_meta("batchd.bench.operator_bench", argv)
    for line in report_lines(figures, args.repeats, args.resources):
        print(line)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    records.write_json(args.output_dir / "operator.json", {"meta": meta, **figures})
    (args.output_dir / "operator.md").write_text(to_markdown(figures, args.repeats, args.resources, meta))
    auto = figures.get("autoscaling")
    if auto and auto["replicas_polled"] < auto["replicas"]:
        print(
            f"FAILED: only {auto['replicas_polled']} of {auto['replicas']} replicas were polled",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
