"""The servers compared, and how each one starts: the same adder, the same batching, one core."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from batchd.api.httpserver import UVICORN_OPTIONS
from batchd.testing import servers
from batchd.testing.manifests import manifest

MODEL = "adder"
MAX_BATCH_SIZE = 32
BATCH_WAIT_S = 0.01
BODY = b'{"instances": [1]}'
ANSWER = b"2"  # what every subject's answer holds
REPLICA_PATH = f"/v1/models/{MODEL}:predict"
MOSEC_PATH = "/inference"
TRIVIAL_ADDER = "batchd.bench.kit.handlers:TrivialAdder.handle_batch"
# Environment variable naming the interpreter of a virtual environment that has Mosec.
MOSEC_PYTHON_ENV = "BATCHD_BENCH_MOSEC_PYTHON"


@dataclass(frozen=True)
class Subject:
    """One server under test: what `start` runs, where it answers and how it says it is ready."""

    name: str
    path: str
    ready_path: str


BATCHD = Subject("batchd", REPLICA_PATH, servers.REPLICA_READY_PATH)
BASELINE = Subject("baseline", REPLICA_PATH, servers.REPLICA_READY_PATH)
# The router benchmark's raw-ASGI adder answers GET /load as an idle replica would.
BARE = Subject("bare", REPLICA_PATH, "/load")
MOSEC = Subject("mosec", MOSEC_PATH, "/")
# The least a batching server on uvicorn does (`minimal`).
MINIMAL = Subject("minimal", REPLICA_PATH, "/load")
ALL = (BATCHD, BASELINE, BARE, MOSEC, MINIMAL)


def adder_manifest() -> dict[str, object]:
    return manifest(
        MODEL,
        {"name": MODEL, "handler": TRIVIAL_ADDER, "device": "cpu"},
        batching={
            "max_batch_size": MAX_BATCH_SIZE,
            "batch_wait_timeout_s": BATCH_WAIT_S,
            "max_queued_requests": 4096,
            "request_timeout_s": 60,
        },
    )


def start(
    subject: Subject,
    workdir: Path,
    cores: set[int] | None,
    baseline_src: Path | None = None,
    mosec_python: Path | None = None,
) -> servers.ServerProcess:
    """Start one subject's server (not waited on: `ServerProcess.wait_ready`)."""
    if subject in (BATCHD, BASELINE):
        quiet = {"BATCHD_LOG_LEVEL": "warning"}
        path = servers.write_manifest(workdir, adder_manifest())
        # A source tree first on the path wins over the installed `batchd.replica`.
        env = quiet if subject is BATCHD else {**quiet, "PYTHONPATH": str(baseline_src)}
        return servers.start_replica(path, workdir, name=subject.name, env=env, cores=cores)
    command = _command(subject, mosec_python)
    return servers.start_process(subject.name, command, workdir, cores=cores, ready_path=subject.ready_path)


def _command(subject: Subject, mosec_python: Path | None) -> list[str]:
    """The command line of a subject that is no batchd replica."""
    if subject is BARE:
        return [
            sys.executable, "-m", "uvicorn", "batchd.bench.router.trivial_adder:app",
            "--loop", str(UVICORN_OPTIONS["loop"]), "--http", str(UVICORN_OPTIONS["http"]),
            "--backlog", str(UVICORN_OPTIONS["backlog"]), "--no-proxy-headers",
            "--timeout-keep-alive", str(UVICORN_OPTIONS["timeout_keep_alive"]),
            "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
    if subject is MOSEC:
        assert mosec_python is not None
        return [str(mosec_python), str(Path(__file__).with_name("mosec_adder.py")), "--log-level", "warning"]
    if subject is MINIMAL:
        return [sys.executable, "-m", "batchd.bench.overhead.minimal"]
    raise ValueError(f"subject: expected one of {', '.join(s.name for s in ALL)}, got {subject.name!r}")
