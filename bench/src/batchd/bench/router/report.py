"""router.md and its charts (router-keepalive.png, router-zero.png): each part's figures (medians
over repeats, each repeat in brackets) and its goals checked. Parts run separately report together."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from batchd.bench.kit.charts import panels
from batchd.bench.kit.formatting import figure, number, share
from batchd.bench.kit.goals import Goal, at_most, bullets
from batchd.bench.kit.records import ran
from batchd.bench.kit.stats import median, ratio
from batchd.bench.router.analysis import (
    CostResult,
    KeepaliveResult,
    Part,
    Results,
    SteadyRun,
    StepRun,
    ZeroResult,
)
from batchd.bench.router.options import (
    ADDED_P50_GOAL_MS,
    COLD_START_MARGIN_S,
    OPERATOR_POLL_S,
    P99_GOAL_RATIO,
    PER_CORE_GOAL_RPS,
    REFUSED_GOAL,
    REPLICA_CAPACITY_RPS,
    SETTLE_GOAL_S,
)


def _median(values: Sequence[float | None]) -> float:
    """The median, a time that never came (None) counting as never."""
    return median([math.inf if value is None else value for value in values])


def _runs(values: Sequence[float | None], text: str) -> str:
    shown = ["never" if v is None or math.isinf(v) else figure(v) for v in values]
    return f"{text} ({', '.join(shown)})" if len(values) > 1 else text


def _heading(title: str, result: Part) -> list[str]:
    """A part's title, then where its figures come from."""
    return [f"## {title}", "", ran(result.meta), ""]


def _time(value: float) -> str:
    return "never" if math.isinf(value) else f"{number(value, 1)} s"


def slowest_settle_s(run: StepRun) -> float | None:
    """The last added replica to take its share; None if one never did."""
    return (
        None
        if any(s is None for s in run.settle_s)
        else max((s for s in run.settle_s if s is not None), default=None)
    )


def keepalive_goals(result: KeepaliveResult) -> list[Goal]:
    router = [run for run in result.step if run.path == "router"]
    steady_router = [run for run in result.steady if run.subject == "router"]
    one = [run for run in result.steady if run.subject == "one replica"]
    if not router or not steady_router or not one:
        return []
    refused = sum(run.refused_503 for run in steady_router) / max(
        1, sum(run.requests for run in steady_router)
    )
    p99_ratio = ratio(median([r.p99_ms for r in steady_router]), median([r.p99_ms for r in one]))
    settle_s = _median([slowest_settle_s(run) for run in router])
    unanswered = sum(run.unanswered for run in router + steady_router)
    return [
        # A replica that never took its share (NaN) misses the goal, as NaN compares.
        Goal(
            f"through the router, each new replica takes its share within {SETTLE_GOAL_S:g} s of ready",
            settle_s,
            SETTLE_GOAL_S,
            settle_s <= SETTLE_GOAL_S,
        ),
        Goal("through the router, none unanswered", unanswered, 0, unanswered == 0),
        Goal(
            f"503s < {share(REFUSED_GOAL)} at {share(result.options['utilisation'])} of capacity",
            refused,
            REFUSED_GOAL,
            refused < REFUSED_GOAL,
        ),
        at_most(
            f"router p99 <= {P99_GOAL_RATIO:g}x one replica's at the same utilisation",
            p99_ratio,
            P99_GOAL_RATIO,
        ),
    ]


def _step_table(result: KeepaliveResult) -> list[str]:
    replicas = int(result.options["replicas"])
    lines = ["| figure | service (connections balanced) | router |", "|---|---:|---:|"]
    by_path = {path: [run for run in result.step if run.path == path] for path in ("service", "router")}
    for index in range(replicas):
        cells = [
            _runs(
                [run.shares[index] * 100 for run in runs],
                f"{share(median([run.shares[index] for run in runs]))}",
            )
            for runs in by_path.values()
        ]
        lines.append(f"| replica {index} share of answers (%) | {cells[0]} | {cells[1]} |")
    settle = [
        _runs(
            [slowest_settle_s(run) for run in runs], _time(_median([slowest_settle_s(run) for run in runs]))
        )
        for runs in by_path.values()
    ]
    lines.append(f"| added replicas: ready -> share (the slowest) | {settle[0]} | {settle[1]} |")
    for label, key in (("p99 of the 200s, ms", "p99_ms"), ("unanswered (sum)", "unanswered")):
        cells = []
        for runs in by_path.values():
            values = [float(getattr(run, key)) for run in runs]
            text = figure(sum(values)) if key == "unanswered" else figure(median(values))
            cells.append(_runs(values, text) if key != "unanswered" else text)
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    statuses = [", ".join(f"{k}: {v}" for k, v in _sum_statuses(runs).items()) for runs in by_path.values()]
    lines.append(f"| answers by status (sum) | {statuses[0]} | {statuses[1]} |")
    return lines


def _sum_statuses(runs: Sequence[StepRun]) -> dict[str, int]:
    total: dict[str, int] = {}
    for run in runs:
        for status, count in run.statuses.items():
            total[status] = total.get(status, 0) + count
    return dict(sorted(total.items()))


def _steady_table(result: KeepaliveResult) -> list[str]:
    lines = [
        "| path | replicas | req/s | p50 ms | p99 ms | 503s | unanswered |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for subject in ("one replica", "service", "router"):
        runs: list[SteadyRun] = [run for run in result.steady if run.subject == subject]
        if not runs:
            continue
        p50, p99 = (median([getattr(run, key) for run in runs]) for key in ("p50_ms", "p99_ms"))
        refused = sum(run.refused_503 for run in runs) / max(1, sum(run.requests for run in runs))
        lines.append(
            f"| {subject} | {runs[0].replicas} | {figure(runs[0].rate_rps)} | "
            f"{_runs([r.p50_ms for r in runs], figure(p50))} | "
            f"{_runs([r.p99_ms for r in runs], figure(p99))} | "
            f"{share(refused, 2)} | {sum(run.unanswered for run in runs)} |"
        )
    return lines


def keepalive_markdown(result: KeepaliveResult) -> str:
    o = result.options
    lines = [
        *_heading("Keep-alive step: connection balancing (a Service) vs the router", result),
        f"A slow adder ({figure(REPLICA_CAPACITY_RPS)} items/s a replica). {o['rate_rps']:g} req/s "
        f"from an aiohttp client with a {int(o['connections'])}-connection keep-alive pool, for "
        f"{o['step_s']:g} s; one replica is an endpoint when the load starts, all "
        f"{int(o['replicas'])} from {o['scale_at_s']:g} s (ready replicas joining the Service, "
        "or their EndpointSlices reaching the router). Shares are each replica's answers (its "
        f"`/metrics`, read every {o['sample_s']:g} s); a new replica takes its share once, "
        f"over {o['window_s']:g} s, it answers at least half an even share. Unanswered: no answer "
        f"within the client's {o['timeout_s']:g} s. Medians of {int(o['repeats'])} interleaved "
        "repeats, each repeat in brackets.",
        "",
        *_step_table(result),
        "",
        "![per-replica share over time](router-keepalive.png)",
        "",
        f"Steady: open loop at {share(o['utilisation'])} of the capacity behind each path for "
        f"{o['steady_s']:g} s (after {o['warmup_s']:g} s not counted), a keep-alive pool of "
        f"{int(o['connections'])} connections per replica; `one replica` is the baseline, direct, at the "
        "same per-replica utilisation.",
        "",
        *_steady_table(result),
        "",
        *bullets(keepalive_goals(result)),
    ]
    return "\n".join(lines) + "\n"


def cost_figures(result: CostResult) -> dict[str, float]:
    rounds = result.rounds
    direct_p50 = median([r.direct_p50_ms for r in rounds])
    router_p50 = median([r.router_p50_ms for r in rounds])
    cpu_us = median([r.router_cpu_us for r in rounds])
    return {
        "added_p50_ms": median([r.router_p50_ms - r.direct_p50_ms for r in rounds]),
        "p50_ratio": ratio(router_p50, direct_p50),
        "rps_ratio": median([ratio(r.router_rps, r.direct_rps) for r in rounds]),
        "cpu_us": cpu_us,
        "per_core_rps": ratio(1e6, cpu_us),
    }


def cost_goals(result: CostResult) -> list[Goal]:
    f = cost_figures(result)
    # A figure not measured (NaN) misses its bound, as NaN compares.
    return [
        Goal(
            f"added p50 <= {ADDED_P50_GOAL_MS:g} ms",
            f["added_p50_ms"],
            ADDED_P50_GOAL_MS,
            f["added_p50_ms"] <= ADDED_P50_GOAL_MS,
        ),
        Goal(
            f">= {figure(PER_CORE_GOAL_RPS)} requests/s per router core",
            f["per_core_rps"],
            PER_CORE_GOAL_RPS,
            f["per_core_rps"] >= PER_CORE_GOAL_RPS,
        ),
    ]


def cost_markdown(result: CostResult) -> str:
    o, rounds, f = result.options, result.rounds, cost_figures(result)
    rows = (
        ("p50, one in flight (ms)", "direct_p50_ms", "router_p50_ms", 3),
        ("p99, one in flight (ms)", "direct_p99_ms", "router_p99_ms", 3),
        (f"requests/s, {int(o['in_flight'])} in flight", "direct_rps", "router_rps", 0),
    )
    lines = [
        *_heading("Router cost on the trivial adder", result),
        f"A raw-ASGI adder (uvicorn, httptools) alone, and the router in front of it; the kit's lean "
        f"raw-asyncio client. Each round measures both paths, taking turns: {o['seconds']:g} s "
        f"with one request in flight, then {o['seconds']:g} s with {int(o['in_flight'])}; the "
        "router's CPU from /proc over the second. Medians of "
        f"{len(rounds)} rounds, each round in brackets.",
        "",
        "| figure | direct | router | router / direct |",
        "|---|---:|---:|---:|",
    ]
    for label, direct_key, router_key, digits in rows:
        direct = [getattr(r, direct_key) for r in rounds]
        through = [getattr(r, router_key) for r in rounds]
        lines.append(
            f"| {label} | {_runs(direct, number(median(direct), digits))} | "
            f"{_runs(through, number(median(through), digits))} | "
            f"{number(ratio(median(through), median(direct)), 2)} |"
        )
    lines += [
        f"| router CPU per request (us) | | "
        f"{_runs([r.router_cpu_us for r in rounds], number(f['cpu_us'], 0))} | |",
        "",
        f"Added p50: {number(f['added_p50_ms'], 3)} ms. Requests/s per router core (1 / CPU per request): "
        f"{number(f['per_core_rps'], 0)}.",
        "",
        *bullets(cost_goals(result)),
    ]
    return "\n".join(lines) + "\n"


def zero_goals(result: ZeroResult) -> list[Goal]:
    runs = result.runs
    bound = result.options["hold_timeout_s"]
    return [
        at_most(
            f"first request answered within the replica's load time + {COLD_START_MARGIN_S:g} s",
            median([r.first_answer_s - r.load_s for r in runs]),
            COLD_START_MARGIN_S,
        ),
        at_most(f"0 lost within the hold bound ({figure(bound)} s)", sum(r.lost for r in runs), 0),
    ]


def zero_markdown(result: ZeroResult) -> str:
    o, runs = result.options, result.runs
    rows = (
        ("first request: sent -> answered (s)", "first_answer_s"),
        ("the replica's own load: process started -> ready (s)", "load_s"),
        ("first request -> demand noticed at `GET /held` (s)", "noticed_s"),
        ("first request -> replica ready (s)", "ready_s"),
        ("slice published -> first answer (s)", "released_s"),
        ("peak held requests", "peak_held"),
    )
    lines = [
        *_heading("Scale from zero: held requests", result),
        f"A deployment at zero replicas gets {o['rate_rps']:g} req/s for {o['seconds']:g} s "
        "through the router, which holds them. The operator's wake-up is a stand-in here: it reads the "
        f"router's `GET /held` every {o['poll_s']:g} s (the operator reads it every "
        f"{OPERATOR_POLL_S:g} s by default while a deployment is at zero; the repeats spread the "
        "first poll evenly over one interval), starts one replica (`batchd serve`, "
        f"the trivial adder) on demand, probes it every {o['probe_s']:g} s and publishes its "
        "EndpointSlice once ready. Medians of "
        f"{len(runs)} repeats, each in brackets.",
        "",
        "| figure | value |",
        "|---|---:|",
    ]
    for label, key in rows:
        values = [float(getattr(r, key)) for r in runs]
        digits = 0 if key == "peak_held" else 2
        lines.append(f"| {label} | {_runs(values, number(median(values), digits))} |")
    lines += [
        f"| requests: answered 200 / sent (sum) | {sum(r.ok for r in runs)} / "
        f"{sum(r.requests for r in runs)} |",
        "",
        "![held requests over time](router-zero.png)",
        "",
        *bullets(zero_goals(result)),
    ]
    return "\n".join(lines) + "\n"


def to_markdown(results: Results) -> str:
    parts = ["# Router benchmark\n"]
    if results.keepalive is not None:
        parts.append(keepalive_markdown(results.keepalive))
    if results.cost is not None:
        parts.append(cost_markdown(results.cost))
    if results.zero is not None:
        parts.append(zero_markdown(results.zero))
    return "\n".join(parts)


PATHS = {"service": "through a connection-balancing proxy (a Service)", "router": "through the router"}


def draw_keepalive(result: KeepaliveResult, path: Path) -> None:
    """One panel per path: each replica's share per window, every repeat (the first boldly)."""
    replicas = int(result.options["replicas"])
    scale_at = result.options["scale_at_s"]
    with panels(path, 2, 1, (9, 6.5), sharex=True, constrained_layout=True) as (figure, grid):
        for (name, title), row in zip(PATHS.items(), grid, strict=True):
            ax = row[0]
            runs = [run for run in result.step if run.path == name]
            for position, run in enumerate(runs):
                for index in range(replicas):
                    shares = [100 * s for s in run.series[f"r{index}"]]
                    ax.plot(
                        run.series["t"],
                        shares,
                        color=f"C{index}",
                        lw=1.6 if position == 0 else 0.7,
                        alpha=1.0 if position == 0 else 0.35,
                        label=f"replica {index}" if position == 0 else None,
                    )
            ax.axhline(100 / replicas, color="grey", ls=":", lw=1)
            ax.axvline(scale_at, color="black", ls="--", lw=1)
            ax.annotate(f" {replicas - 1} replicas ready", (scale_at, 92), fontsize=8)
            ax.set_ylim(-2, 105)  # 100% stays visible above the frame
            ax.set_ylabel(f"% of answers per {result.options['window_s']:g} s")
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="center right")
        grid[-1][0].set_xlabel("seconds since the load started")
        figure.suptitle(
            f"{result.options['rate_rps']:g} req/s, {int(result.options['connections'])}-connection "
            f"keep-alive pool, 1 -> {replicas} replicas (dotted: an even share)",
            fontsize=10,
        )


def draw_zero(result: ZeroResult, path: Path) -> None:
    """Held requests and requests answered so far over time, every repeat."""
    with panels(path, 1, 1, (9, 4), constrained_layout=True) as (figure, grid):
        ax = grid[0][0]
        for position, run in enumerate(result.runs):
            strong = position == 0
            ax.plot(run.series["t"], run.series["held"], color="C3", lw=1.6 if strong else 0.7,
                    alpha=1 if strong else 0.4, label="held by the router" if strong else None)  # fmt: skip
            ax.plot(run.series["t"], run.series["answered"], color="C2", lw=1.6 if strong else 0.7,
                    alpha=1 if strong else 0.4, label="answered 200 so far" if strong else None)  # fmt: skip
            released = run.series["released_t"][0]
            if not math.isnan(released):
                ax.axvline(released, color="C2", ls=":", lw=1)
        ax.set_xlabel("seconds since the first request")
        ax.set_ylabel("requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        figure.suptitle(
            f"Scale from zero: {result.options['rate_rps']:g} req/s held until a first replica is ready "
            f"(demand read every {result.options['poll_s']:g} s); each repeat",
            fontsize=10,
        )
