"""`python -m batchd.bench.prefix`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from concurrent.futures import Future, ThreadPoolExecutor

from batchd.bench import prefix
from batchd.bench.kit.command import Benchmark, Flag, Run, main
from batchd.bench.kit.peer_servers import venvs
from batchd.bench.kit.peer_servers.catalog import PEERS, describe, placement
from batchd.bench.kit.peer_servers.catalog import Options as PeerOptions
from batchd.bench.kit.peer_servers.results import Results as PeerResults
from batchd.bench.kit.peer_servers.workload import environments, run_all
from batchd.bench.prefix.analysis import Results, peer_goals
from batchd.bench.prefix.replica_runs import run_replica_part
from batchd.bench.prefix.report import draw_chart, to_markdown
from batchd.bench.prefix.routing_runs import control_plane, run_routing_part
from batchd.bench.prefix.workload import PARTS, QUICK, Options
from batchd.testing.kubernetes.controlplane import ControlPlane


def run_peers(run: Run[Options], server_cores: set[int] | None, load_cores: set[int] | None) -> PeerResults:
    """The peers benchmark's generator load, the peers given, batchd's cache on and off among them."""
    options = run.options
    peer_options = PeerOptions(
        peers=options.peers,
        models=("gpt2",),
        repeats=options.peer_repeats,
        duration_s=options.peer_duration_s,
        warmup_s=max(options.warmup_s, PeerOptions.warmup_s),
    )
    pythons, infos = environments(options.peers, venvs.CACHE_DIR)
    runs, ceilings = run_all(peer_options, pythons, run.workdir / "peers", server_cores)
    placed = describe(server_cores, load_cores)
    return PeerResults(run.record, dataclasses.asdict(peer_options), placed, infos, runs, ceilings)


def measure(run: Run[Options]) -> Results:
    options = run.options
    everywhere = os.sched_getaffinity(0)
    server_cores, load_cores = placement()
    found: dict[str, object] = {}
    # On the way out the control plane's start is waited for, then it is stopped.
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(1) as starting:
        cluster: Future[ControlPlane] | None = None
        if "routing" in options.parts and options.early_control_plane:
            cluster = starting.submit(stack.enter_context, control_plane(run.workdir))
        try:
            if "replica" in options.parts:
                if load_cores:
                    os.sched_setaffinity(0, load_cores)  # this process drives the load
                found["replica"] = run_replica_part(options, run.workdir, server_cores, everywhere)
            if "routing" in options.parts:
                os.sched_setaffinity(0, everywhere)  # a replica on each core: the load goes where it can
                started = None if cluster is None else cluster.result()
                found["routing"] = run_routing_part(options, run.workdir, started)
            if "peers" in options.parts:
                if load_cores:
                    os.sched_setaffinity(0, load_cores)
                (run.workdir / "peers").mkdir(exist_ok=True)
                peers = run_peers(run, server_cores, load_cores)
                found["peers"], found["peer_goals"] = peers, peer_goals(peers)
        finally:
            os.sched_setaffinity(0, everywhere)
    return Results(run.record, dataclasses.asdict(options), **found)  # type: ignore[arg-type]


def failure(results: Results) -> str | None:
    parts = (results.replica, results.routing)
    measured = any(part is not None and part.runs for part in parts)
    peers = results.peers is not None and any(run.measured for run in results.peers.runs)
    return None if measured or peers else "nothing could be measured"


BENCHMARK = Benchmark(
    module="batchd.bench.prefix",
    doc=prefix.__doc__,
    stem="prefix",
    defaults=Options(),
    quick=QUICK,
    flags={
        "parts": Flag("which parts", choices=PARTS),
        "repeats": Flag("interleaved repeats of the replica and routing parts", minimum=1),
        "duration_s": Flag("each measured loop, in seconds", above=0),
        "peers": Flag("the peers beside batchd on the generator", choices=tuple(PEERS)),
        "peer_repeats": Flag("repeats of the peers' generator load", minimum=1),
        "peer_duration_s": Flag("each of the peers' measured closed loops, in seconds", above=0),
        "threads": Flag("torch threads of every replica (OMP_NUM_THREADS)", minimum=1),
    },
    measure=measure,
    markdown=to_markdown,
    results=Results,
    chart=draw_chart,
    failure=failure,
    log_level=logging.WARNING,
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
