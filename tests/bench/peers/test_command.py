"""`python -m batchd.bench.peers` as a user runs it: bad options refused by name, and a smoke-sized
run of batchd alone (no peer environment is made in tests: they take PyPI and minutes)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from batchd.bench.kit.command import options_from, parse_args
from batchd.bench.kit.peer_servers.catalog import MODELS, batchd_manifest
from batchd.bench.kit.peer_servers.servers import models
from batchd.bench.kit.peer_servers.workload import server_env
from batchd.bench.peers.__main__ import BENCHMARK, with_baseline
from batchd.testing import ROOT
from tests.bench.conftest import RunModule

MODULE = "batchd.bench.peers"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--peers", "tgi"],
            "--peers: invalid choice: 'tgi' (choose from 'batchd', 'unbatched', 'uncached', 'floor'",
        ),
        (
            ["--peers", "baseline"],
            "--peers: baseline needs --baseline-src, the replica source tree it runs from",
        ),
        (
            ["--baseline-src", "/nowhere"],
            "--baseline-src: expected a replica source tree (batchd/replica in it)",
        ),
        (["--models", "gpt5"], "--models: invalid choice: 'gpt5' (choose from 'adder', 'minilm', 'gpt2')"),
        (["--repeats", "0"], "--repeats: expected 1 or more, got 0"),
        (["--duration-s", "0"], "--duration-s: expected more than 0, got 0"),
        (["--device", "tpu"], "--device: invalid choice: 'tpu' (choose from 'cpu', 'cuda')"),
    ],
)
def test_a_bad_option_is_refused_naming_it_and_its_value(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(BENCHMARK, args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_device_asked_for_reaches_batchd_and_every_peers_model(tmp_path: Path) -> None:
    options = options_from(BENCHMARK, parse_args(BENCHMARK, ["--device", "cuda"]))
    assert options.device == "cuda"
    minilm = MODELS["minilm"]
    assert batchd_manifest(minilm, device=options.device)["spec"]["model"]["device"] == "cuda"
    env = server_env("mosec", minilm, None, tmp_path, options.device)
    assert env[models.DEVICE_VARIABLE] == "cuda"
    assert options_from(BENCHMARK, parse_args(BENCHMARK, [])).device == "cpu"


def test_a_baseline_tree_is_a_peer_of_its_own_first_on_its_path(tmp_path: Path) -> None:
    tree = ROOT / "replica" / "src"
    options = with_baseline(options_from(BENCHMARK, parse_args(BENCHMARK, ["--baseline-src", str(tree)])))
    assert options.peers[-1] == "baseline" and "batchd" in options.peers
    env = server_env("baseline", MODELS["adder"], None, tmp_path, "cpu", options.baseline_src)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tree.resolve())
    assert "baseline" not in with_baseline(options_from(BENCHMARK, parse_args(BENCHMARK, []))).peers


@pytest.mark.slow
def test_a_smoke_sized_run_of_batchd_measures_it_and_writes_the_results(
    run_module: RunModule, tmp_path: Path
) -> None:
    done = run_module(
        MODULE,
        "--peers",
        "batchd",
        "unbatched",
        "minimal",
        "baseline",
        "--baseline-src",
        str(ROOT / "replica" / "src"),
        "--models",
        "adder",
        "--quick",
        "--output-dir",
        str(tmp_path),
        timeout_s=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "peers.json").read_text())
    runs = {run["peer"]: run for run in results["runs"]}
    assert set(runs) == {"batchd", "unbatched", "minimal", "baseline"}
    for run in runs.values():  # the least batching server and batchd from a tree of its own answer too
        assert run["failure"] == "" and run["requests"] > 0 and run["errors"] == 0, run
        assert run["cpu_ms_per_request"] > 0 and run["rss_mb"] > 0 and run["idle_rss_mb"] > 0
    report = (tmp_path / "peers.md").read_text()
    assert re.search(r"^\| batchd \| [0-9,]+ \| [0-9.]+ \|", report, re.MULTILINE), report
    assert (tmp_path / "peers.png").stat().st_size > 0


def test_unbatched_is_batchd_with_batches_of_one_and_no_wait() -> None:
    batching = batchd_manifest(MODELS["minilm"], batched=False)["spec"]["batching"]
    assert (batching["max_batch_size"], batching["batch_wait_timeout_s"]) == (1, 0.0)
    assert batchd_manifest(MODELS["minilm"])["spec"]["batching"]["max_batch_size"] == models.MAX_BATCH_SIZE
