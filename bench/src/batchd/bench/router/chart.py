"""router-keepalive.png (each replica's share over time, both paths) and router-zero.png (held and
answered requests over time during a cold start)."""

from __future__ import annotations

import math
from pathlib import Path

from batchd.bench.kit.charts import panels
from batchd.bench.router.results import KeepaliveResult, ZeroResult

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
