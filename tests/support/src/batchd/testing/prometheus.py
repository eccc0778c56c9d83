"""A real Prometheus (Debian's `prometheus` binary) scraping targets on loopback, for tests.

Started on a free port with its own data directory and a one-second scrape interval; every
wait is a bounded poll. `make tools` installs the binary on a fresh machine.

Any test folder gets the `start_prometheus` fixture with
`pytest_plugins = ["batchd.testing.prometheus"]` (tests/conftest.py does).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from batchd.testing.servers import free_port, wait_until
from batchd.testing.waiting import answers_ok

Series = list[dict[str, Any]]


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def query(self, promql: str) -> Series:
        """The instant vector (or scalar, as one series) a PromQL expression returns now."""
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise ValueError(f"PromQL {promql!r} failed: {body.get('errorType')}: {body.get('error')}")
        data = body["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: Series = data["result"]
        return result

    def wait_for(self, promql: str, predicate: Callable[[Series], bool], timeout_s: float = 30) -> Series:
        """Poll a query until its result satisfies `predicate`; the last result is returned."""
        last: Series = []

        def satisfied() -> bool:
            nonlocal last
            last = self.query(promql)
            return predicate(last)

        try:
            wait_until(satisfied, timeout_s, f"PromQL {promql!r}")
        except TimeoutError:
            raise TimeoutError(
                f"PromQL {promql!r} never satisfied the test within {timeout_s} s; last: {last}"
            ) from None
        return last

    def targets_up(self) -> bool:
        active = httpx.get(f"{self.url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return bool(active) and all(target["health"] == "up" for target in active)


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed: run `make tools` (Debian package prometheus)")
    return path


@contextmanager
def prometheus(targets: list[str], tmp_path: Path, job: str = "batchd-replica") -> Iterator[Prometheus]:
    """Prometheus scraping `host:port` targets every second; yields once every target is up."""
    port = free_port()
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        # honor_labels: the exporters' own labels (deployment, model, namespace) win over Prometheus's,
        # as the chart's PodMonitor keeps them.
        "scrape_configs": [{"job_name": job, "honor_labels": True, "static_configs": [{"targets": targets}]}],
    }
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = tmp_path / "prometheus.log"
    command = [
        binary("prometheus"),
        f"--config.file={config_path}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = Prometheus(f"http://127.0.0.1:{port}", process, log_path)
    try:
        wait_until(lambda: process.poll() is not None or _ready(server.url), 60, "prometheus ready")
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {process.returncode}:\n{log_path.read_text()}")
        wait_until(server.targets_up, 30, f"prometheus scraping {targets}")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def _ready(url: str) -> bool:
    return answers_ok(f"{url}/-/ready")


def promtool_check_metrics(exposition: str) -> list[str]:
    """What `promtool check metrics` finds wrong with a /metrics text (lint of names, units, help)."""
    result = subprocess.run(
        [binary("promtool"), "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=60
    )
    return [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]


StartPrometheus = Callable[..., Prometheus]


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[StartPrometheus]:
    """`start_prometheus(["127.0.0.1:PORT"], job=...)` -> a running Prometheus, stopped after the test."""
    with ExitStack() as stack:
        started: list[Prometheus] = []

        def start(targets: list[str], job: str = "batchd-replica") -> Prometheus:
            directory = tmp_path / f"prometheus-{len(started)}"
            server = stack.enter_context(prometheus(targets, directory, job))
            started.append(server)
            return server

        yield start
