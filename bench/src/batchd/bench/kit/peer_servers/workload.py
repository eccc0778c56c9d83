"""The runs: each peer started alone on the servers' cores, warmed, driven by the same closed loop,
measured from its whole process tree, and stopped, in an order that turns with every repeat.

One server at a time: an idle Ray cluster or BentoML arbiter still takes CPU, which would be
charged to whichever peer runs beside it. A peer whose environment cannot be made, or that does
not answer within the bound, is recorded as such with the reason, and the others go on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from batchd.bench.kit import CHECKOUT, loadgen, processtree
from batchd.bench.kit.peer_servers import venvs
from batchd.bench.kit.peer_servers.catalog import MODELS, PEERS, Model, Options, Peer, batchd_manifest
from batchd.bench.kit.peer_servers.results import CeilingRun, PeerInfo, Run
from batchd.bench.kit.peer_servers.servers import models
from batchd.bench.kit.repeats import rotated
from batchd.bench.kit.stats import percentile
from batchd.testing.models import build_gpt2, minilm_mirror
from batchd.testing.servers import ServerFailed, ServerProcess, free_port, write_manifest

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
BENCH_SRC = CHECKOUT / "bench" / "src"
MB = 1024 * 1024
STOP_TIMEOUT_S = 30.0
CEILING = "ceiling"  # the pseudo-subject that takes its turn among the peers on MiniLM
# Answers that no wait will change: the server is up and refuses the request itself.
REFUSALS = frozenset({400, 405, 415, 422})


def environments(peers: Sequence[str], cache_dir: Path) -> tuple[dict[str, Path], list[PeerInfo]]:
    """Each peer's interpreter (batchd's is this one), made if need be; what the report says of each."""
    pythons: dict[str, Path] = {}
    infos: list[PeerInfo] = []
    for name in peers:
        peer = PEERS[name]
        if not peer.own_env:
            pythons[name] = Path(sys.executable)
            infos.append(PeerInfo(name, peer.title, "", peer.how))
            continue
        logger.warning("peers: the %s environment (made once, then reused)", name)
        try:
            env = venvs.ensure(name, cache_dir)
        except (venvs.InstallFailed, subprocess.SubprocessError, OSError) as error:
            infos.append(PeerInfo(name, peer.title, "", peer.how, unavailable=f"not installed: {error}"))
            continue
        pythons[name] = env.python
        infos.append(PeerInfo(name, peer.title, env.version_of(peer.distribution), peer.how))
    return pythons, infos


def server_env(
    peer: str,
    model: Model,
    cores: set[int] | None,
    workdir: Path,
    device: str,
    baseline_src: str | None = None,
) -> dict[str, str]:
    """What every server process gets: the model and its device, one torch thread per core it has,
    no telemetry; the baseline its source tree first on its path (it wins over the installed one)."""
    threads = str(len(cores) if cores else len(os.sched_getaffinity(0)))
    env = {
        **os.environ,
        "PYTHONPATH": str(BENCH_SRC),
        "PYTHONUNBUFFERED": "1",
        models.MODEL_VARIABLE: model.name,
        models.DEVICE_VARIABLE: device,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "BATCHD_LOG_LEVEL": "warning",
        "RAY_USAGE_STATS_ENABLED": "0",
        "BENTOML_DO_NOT_TRACK": "true",
        "HF_HUB_OFFLINE": "1",
    }
    if peer == "baseline":
        assert baseline_src is not None, "the baseline runs from --baseline-src"
        env["PYTHONPATH"] = os.pathsep.join((baseline_src, str(BENCH_SRC)))
    if peer == "pytriton":
        # PyTriton's Python stub links libpython3.11.so.1.0 wherever the loader finds it first: the
        # system's (an older 3.11 than the stdlib it then runs) unless this interpreter's comes first.
        env["LD_LIBRARY_PATH"] = str(sysconfig.get_config_var("LIBDIR"))
    if model.name == "minilm":
        env["BATCHD_MODEL_MIRROR"] = str(minilm_mirror(workdir / "mirror"))
    if model.name == "gpt2":
        env[models.GPT2_DIR_VARIABLE] = str(gpt2_dir(workdir))
    return env


def gpt2_dir(workdir: Path) -> Path:
    """The tiny GPT-2 every server generates with, built once per run (random weights, seeded)."""
    directory = workdir / "gpt2-tiny"
    if not (directory / "config.json").exists():
        build_gpt2(directory)
    return directory


def start(
    peer: Peer,
    model: Model,
    python: Path,
    workdir: Path,
    cores: set[int] | None,
    device: str,
    baseline_src: str | None = None,
) -> ServerProcess:
    """The peer's server in a process group of its own (so that stopping it reaches every process
    it started), pinned to `cores`, its output in a log file of its own."""
    port = free_port(HOST)
    manifest_path = None
    if peer.serves_manifest:
        generator = gpt2_dir(workdir) if model.name == "gpt2" else None
        batched = peer.name != "unbatched"
        cached = peer.name != "uncached"
        manifest_path = write_manifest(workdir, batchd_manifest(model, generator, device, batched, cached))
    command = [*peer.command(python, model, manifest_path), "--host", HOST, "--port", str(port)]
    log_path = workdir / f"{peer.name}-{model.name}-{port}.log"
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=CHECKOUT,  # batchd imports its handler from here, as a replica from its image
            env=server_env(peer.name, model, cores, workdir, device, baseline_src),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=pin,
            start_new_session=True,
        )
    return ServerProcess(f"{peer.title} ({model.name})", HOST, port, process, log_path)


def stop(server: ServerProcess) -> None:
    """SIGTERM to the server's process group, SIGKILL if it will not go; then, by pid, any process
    of its tree that had left the group (a daemon that made a session of its own)."""
    tree = processtree.sample(server.pid) if server.process.poll() is None else None
    group = server.process.pid
    try:
        os.killpg(group, signal.SIGTERM)
        server.process.wait(timeout=STOP_TIMEOUT_S)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(group, signal.SIGKILL)
        server.process.wait(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)  # workers that outlived their parent
    for pid in tree.cpu_s if tree else ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def wait_answering(server: ServerProcess, path: str, body: bytes, timeout_s: float) -> None:
    """Poll with a real request until one is answered 200 (a server's health route can say ready
    before its model worker is), within `timeout_s`; the log's tail if it exits or never answers."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            response = httpx.post(
                f"{server.url}{path}", content=body, headers={"content-type": "application/json"}, timeout=10
            )
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code in REFUSALS:
                break
        except httpx.HTTPError as error:
            last = f"{type(error).__name__}: {error}"
        time.sleep(0.2)  # a poll interval, bounded by the deadline
    raise ServerFailed(
        f"no answer 200 within {timeout_s:.0f} s ({last}); its log ends:\n{server.log_tail(15)}"
    )


def measure(
    peer: Peer,
    model: Model,
    python: Path,
    repeat: int,
    options: Options,
    workdir: Path,
    cores: set[int] | None,
) -> Run:
    """Start, wait for a first answer (then read its idle memory), warm up, measure one closed
    loop, stop."""
    path, body = peer.path(model), peer.body(model)
    server = start(peer, model, python, workdir, cores, options.device, options.baseline_src)
    try:
        wait_answering(server, path, body, options.ready_timeout_s)
        idle = processtree.sample(server.pid)
        request = loadgen.Request.post_json(HOST, server.port, path, body)
        window: list[processtree.TreeSample] = []  # the tree when the measured window opens
        load = loadgen.closed_loop(
            HOST,
            server.port,
            request,
            model.clients,
            options.duration_s,
            warmup_s=options.warmup_s,
            stagger_s=options.warmup_s if model.staggered else 0.0,
            at_window=lambda: window.append(processtree.sample(server.pid)),
        )
        result = loadgen.run(load)
        tree = processtree.sample(server.pid)
        (before,) = window
        server.check_alive()
    except (ServerFailed, OSError, httpx.HTTPError) as error:
        return Run(peer.name, model.name, repeat, model.clients, failure=str(error))
    finally:
        stop(server)
    cpu_s = processtree.cpu_between(before, tree)
    rps = result.steady_rps
    return Run(
        peer.name,
        model.name,
        repeat,
        model.clients,
        requests=result.completed,
        errors=result.errors,
        rps=rps,
        tokens_per_s=rps * model.tokens if model.tokens else math.nan,
        p50_ms=percentile(result.latencies_s, 50) * 1000,
        p99_ms=percentile(result.latencies_s, 99) * 1000,
        cpu_ms_per_request=cpu_s / result.completed * 1000 if result.completed else float("nan"),
        cores_busy=cpu_s / result.duration_s,
        rss_mb=tree.rss_bytes / MB,
        idle_rss_mb=idle.rss_bytes / MB,
        pss_mb=tree.pss_bytes / MB,
        processes=tree.processes,
        client_cpu_s=result.client_cpu_s,
        error_samples=result.error_samples,
    )


def measure_ceiling(repeat: int, options: Options, workdir: Path, cores: set[int] | None) -> CeilingRun:
    """The embedder the peers call, alone in a process on the servers' cores, at their max batch."""
    command = [
        sys.executable, "-m", "batchd.bench.kit.peer_servers.servers.ceiling",
        "--batch-size", str(models.MAX_BATCH_SIZE), "--duration-s", str(options.ceiling_s),
    ]  # fmt: skip
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    done = subprocess.run(
        command,
        env=server_env("ceiling", MODELS["minilm"], cores, workdir, options.device),
        capture_output=True,
        text=True,
        preexec_fn=pin,
        timeout=options.ready_timeout_s + options.ceiling_s * 10,
        check=False,
    )
    if done.returncode != 0:
        logger.warning("peers: the ceiling failed (%d): %s", done.returncode, done.stderr[-2000:])
        return CeilingRun(repeat, models.MAX_BATCH_SIZE, float("nan"), 0)
    figures = json.loads(done.stdout.splitlines()[-1])
    return CeilingRun(
        repeat, models.MAX_BATCH_SIZE, figures["items_per_s"], figures["threads"], figures["rss_mb"]
    )


def run_all(
    options: Options, pythons: dict[str, Path], workdir: Path, server_cores: set[int] | None
) -> tuple[list[Run], list[CeilingRun]]:
    """Every (repeat, model, peer), peers in an order turned each repeat; the MiniLM ceiling takes
    its turn among them. A peer that failed on a model is not started again for it."""
    runs: list[Run] = []
    ceilings: list[CeilingRun] = []
    failed: set[tuple[str, str]] = set()
    for repeat in range(options.repeats):
        for model_name in options.models:
            model = MODELS[model_name]
            subjects = [name for name in options.peers if name in pythons]
            if model_name == "minilm":
                subjects.append(CEILING)
            for name in rotated(subjects, repeat):
                if name != CEILING and ((name, model_name) in failed or model_name not in PEERS[name].models):
                    continue
                print(f"peers, repeat {repeat + 1}/{options.repeats}, {model_name}: {name}", flush=True)
                if name == CEILING:
                    ceilings.append(measure_ceiling(repeat, options, workdir, server_cores))
                    continue
                one = measure(PEERS[name], model, pythons[name], repeat, options, workdir, server_cores)
                if one.failure:
                    logger.warning("peers: %s on %s: %s", name, model_name, one.failure)
                    failed.add((name, model_name))
                runs.append(one)
    return runs, ceilings
