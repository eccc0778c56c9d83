"""The peers benchmark's figures from made-up runs: medians, ratios within a repeat, the goals,
where a peer is ahead, a peer that could not run, and the report read back from its JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from batchd.bench.kit import records
from batchd.bench.kit.command import publish
from batchd.bench.kit.peer_servers.catalog import Options
from batchd.bench.kit.peer_servers.results import CeilingRun, PeerInfo, Results, Row, Run, rows
from batchd.bench.kit.records import RunRecord
from batchd.bench.peers import analysis
from batchd.bench.peers.__main__ import BENCHMARK
from batchd.bench.peers.report import to_markdown

META = RunRecord("2026-01-01 00:00 UTC", "test machine", "python -m batchd.bench.peers")
INFOS = [
    PeerInfo("batchd", "batchd", "", "uvicorn"),
    PeerInfo("unbatched", "batchd, max_batch_size 1", "", "batches of one"),
    PeerInfo("mosec", "Mosec", "0.9.8", "Rust front"),
    PeerInfo("floor", "bare uvicorn (floor)", "", "a constant answer"),
    PeerInfo("ray", "Ray Serve", "", "a Ray cluster", unavailable="not installed: pip exited 1"),
]


def _run(peer: str, model: str, repeat: int, rps: float, p99_ms: float, cpu_ms: float) -> Run:
    return Run(
        peer,
        model,
        repeat,
        128,
        int(rps * 10),
        0,
        rps,
        p50_ms=p99_ms / 2,
        p99_ms=p99_ms,
        cpu_ms_per_request=cpu_ms,
        cores_busy=1.0,
        rss_mb=500.0,
        pss_mb=450.0,
        processes=2,
    )


def _results(
    batchd_adder: tuple[float, float, float] = (4000, 70, 0.14),
    batchd_minilm_rps: float = 240,
) -> Results:
    runs = []
    for repeat, noise in enumerate((1.0, 0.5, 1.1)):  # the machine slows down alike for both
        rps, p99, cpu = batchd_adder
        runs += [
            _run("batchd", "adder", repeat, rps * noise, p99 / noise, cpu),
            _run("mosec", "adder", repeat, 5000 * noise, 40 / noise, 0.085),
            _run("floor", "adder", repeat, 9000 * noise, 20 / noise, 0.04),
            _run("batchd", "minilm", repeat, batchd_minilm_rps * noise, 300, 8.0),
            _run("mosec", "minilm", repeat, 200 * noise, 350, 10.0),
            _run("unbatched", "minilm", repeat, 60 * noise, 900, 20.0),
        ]
    ceilings = [CeilingRun(repeat, 32, 250 * noise, 1, 400.0) for repeat, noise in enumerate((1.0, 0.5, 1.1))]
    options = {**Options().__dict__, "peers": ("batchd", "unbatched", "mosec", "floor", "ray")}
    return Results(META, options, "servers on core 0, load on core 1", INFOS, runs, ceilings)


def _row(table: list[Row], peer: str, model: str) -> Row:
    return next(row for row in table if row.peer == peer and row.model == model)


def test_ratios_are_taken_within_each_repeat_so_a_slow_minute_cancels_out() -> None:
    table = rows(_results())
    mosec = _row(table, "mosec", "adder")
    assert mosec.medians["rps"] == 5000
    assert mosec.vs["batchd"]["rps"] == pytest.approx(1.25)  # every repeat alike, whatever the noise
    assert mosec.vs["batchd"]["cpu_ms_per_request"] == pytest.approx(0.085 / 0.14)
    assert _row(table, "batchd", "adder").vs["batchd"]["rps"] == pytest.approx(1.0)
    assert _row(table, "batchd", "minilm").ceiling_share == pytest.approx(240 / 250)


def test_the_floor_is_a_bound_beside_the_peers_never_one_of_them() -> None:
    table = rows(_results())
    assert _row(table, "floor", "adder").vs["batchd"]["rps"] == pytest.approx(9000 / 4000)
    assert not [row for row in table if row.peer == "floor" and row.model == "minilm"]  # it serves no model
    assert "floor" not in {lead.peer for lead in analysis.leads(table)}
    every_peer = next(goal for goal in analysis.goals(_results()) if "every peer" in goal.name)
    assert every_peer.detail == "closest: mosec"


def test_a_peer_that_could_not_be_installed_has_a_row_that_says_why() -> None:
    row = _row(rows(_results()), "ray", "adder")
    assert row.repeats == 0 and math.isnan(row.medians["rps"])
    assert "pip exited 1" in row.failure


def test_the_goals_are_missed_where_mosec_is_ahead_and_met_where_batchd_is() -> None:
    behind = {goal.name.split(":")[1].split("(")[0].strip(): goal for goal in analysis.goals(_results())}
    assert behind["server CPU per request <= Mosec's"].met is False
    assert behind["throughput >= Mosec's"].met is False
    assert behind["p99 <= Mosec's"].met is False
    assert behind["throughput >= every peer's"].met is True
    assert behind["throughput >= 0.95 of the model's batched ceiling"].met is True
    assert behind["throughput >= 0.5 of bare uvicorn's"].measured == pytest.approx(4000 / 9000)
    assert behind["throughput >= 0.5 of bare uvicorn's"].met is False
    assert behind["throughput >= 3.5x unbatched"].measured == pytest.approx(4.0)
    assert behind["throughput >= 3.5x unbatched"].met is True
    assert behind["idle memory within 64 MB of the model alone in a process"].met is None  # no idle figure
    ahead = analysis.goals(_results(batchd_adder=(6000, 30, 0.08), batchd_minilm_rps=150))
    assert [goal.met for goal in ahead] == [True, True, True, True, False, False, False, None]


def test_idle_memory_is_batchds_after_its_first_answer_against_the_model_alone() -> None:
    results = _results()
    runs = [
        dataclasses.replace(run, idle_rss_mb=420.0 + run.repeat) if run.peer == "batchd" else run
        for run in results.runs
    ]
    idle = next(
        goal for goal in analysis.goals(dataclasses.replace(results, runs=runs)) if "idle" in goal.name
    )
    assert idle.measured == 21.0 and idle.met is True  # 421 MB against the model's 400 alone
    assert idle.detail == "batchd 421 MB, the model alone 400 MB"


def test_where_a_peer_is_ahead_names_the_peer_the_figure_and_the_factor() -> None:
    leads = analysis.leads(rows(_results()))
    assert {(lead.peer, lead.model, lead.figure) for lead in leads} == {
        ("mosec", "adder", "rps"),
        ("mosec", "adder", "p99_ms"),
        ("mosec", "adder", "cpu_ms_per_request"),
    }  # on MiniLM batchd is ahead on every figure
    assert next(lead.factor for lead in leads if lead.figure == "rps") == pytest.approx(1.25)


def test_the_report_is_written_read_back_and_drawn(tmp_path: Path) -> None:
    results = _results()
    publish(BENCHMARK, results, tmp_path, "peers")
    again = records.from_json(Results, json.loads((tmp_path / "peers.json").read_text()))
    assert to_markdown(again) == to_markdown(results) == (tmp_path / "peers.md").read_text()
    text = to_markdown(results)
    assert "| Mosec | 5,000 |" in text
    assert "| Ray Serve | not measured: not installed: pip exited 1 |" in text
    assert "Mosec, req/s 1.25x better than batchd's" in text
    assert "the models on cpu" in text and "Read the ratios within one run" in text
    assert (tmp_path / "peers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
