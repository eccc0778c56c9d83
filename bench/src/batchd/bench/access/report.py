"""access.md and access.png: each way in's latency and the router's CPU per request (medians over
repeats, the CPU a credential adds to access off in the same repeat), the TokenReviews, and the
goals checked."""

from __future__ import annotations

from pathlib import Path

from batchd.bench.access.analysis import (
    Results,
    decision_added_us,
    figures,
    goals,
    probe_ratio,
    reviews_per_ttl,
)
from batchd.bench.access.options import ADDED_CPU_GOAL_US, OFF
from batchd.bench.kit.charts import panels
from batchd.bench.kit.formatting import figure, number
from batchd.bench.kit.goals import bullets
from batchd.bench.kit.records import ran
from batchd.bench.kit.stats import median

WAY_NAMES = {"off": "access off", "key": "API key", "token": "token (review cached)"}


def _ways(results: Results) -> list[str]:
    o = results.options
    lines = [
        "## Through the router",
        "",
        f"Every repeat measures each way in turn (who goes first rotates): {o['seconds']:g} s with one "
        f"request in flight (p50, p99), then {o['seconds']:g} s with {int(o['in_flight'])} in flight (the "
        f"router's CPU per request from /proc), each after {o['warmup_s']:g} s of warm-up. Medians of "
        f"{int(o['repeats'])} repeats; the CPU added is this way's minus access off's in the same repeat "
        "(its median).",
        "",
        "| way in | p50 (ms) | p99 (ms) | requests/s | router CPU/request (us) | added (us) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for f in figures(results):
        added = "" if f.way == OFF else number(f.added_cpu_us, 1)
        lines.append(
            f"| {WAY_NAMES[f.way]} | {number(f.p50_ms, 2)} | {number(f.p99_ms, 2)} | {figure(f.rps)} | "
            f"{number(f.router_cpu_us, 1)} | {added} |"
        )
    lines += ["", "Every round:", "", "| repeat | way in | p50 (ms) | router CPU/request (us) |"]
    lines.append("|---:|---|---:|---:|")
    for r in results.rounds:
        cpu = number(r.router_cpu_us, 1)
        lines.append(f"| {r.repeat + 1} | {WAY_NAMES[r.way]} | {number(r.p50_ms, 2)} | {cpu} |")
    return [*lines, ""]


def _reviews(results: Results) -> list[str]:
    reviews = results.reviews
    if reviews is None:
        return []
    # Under a minute, a rate a minute would quote one review as many.
    rate = f", {number(reviews.count / reviews.minutes, 2)} a minute" if reviews.minutes >= 1 else ""
    return [
        "## TokenReviews",
        "",
        f"The router made {reviews.count} TokenReviews in the token's rounds ({number(reviews.minutes, 1)} "
        f"minutes from the first to the last, one token){rate}: {number(reviews_per_ttl(reviews), 1)} per "
        f"review TTL ({reviews.ttl_s:g} s).",
        "",
    ]


def _probe(results: Results) -> list[str]:
    probe = results.probe
    if probe is None:
        return []
    return [
        "## The cache probe",
        "",
        f"{probe.tries} tries through the router to a tiny GPT-2 with a prefix cache, each: tenant alpha "
        "sends a prompt twice, tenant beta sends it claiming alpha's caller and tenant in every header "
        "it may write and alpha's `user` in the body, then a fresh prompt of the same length (one new "
        f"token each). Alpha's second send hit its own cache in {probe.controls} of {probe.tries}; beta's "
        f"probe hit anything in {probe.hits}. Beta's probe took {number(median(probe.probe_s) * 1000, 1)} ms "
        f"(median) against {number(median(probe.fresh_s) * 1000, 1)} ms for a fresh prompt: "
        f"{number(probe_ratio(probe), 2)}x.",
        "",
    ]


def _decision(results: Results) -> list[str]:
    found = results.decision_us
    if not found:
        return []
    o = results.options
    lines = [
        "## The decision, in one process",
        "",
        "The router's own code for one request of each way in (`batchd.bench.access.decision`): the "
        "identity headers stripped, the caller decided, the stamp signed; "
        f"{int(o['decision_iterations']):,} requests a round, the ways interleaved, medians of "
        f"{int(o['decision_rounds'])} rounds (CPU time).",
        "",
        "| way in | CPU per request (us) | added to access off (us) |",
        "|---|---:|---:|",
    ]
    for way, values in found.items():
        added = "" if way == OFF else number(decision_added_us(results, way), 1)
        lines.append(f"| {WAY_NAMES[way]} | {number(median(values), 1)} | {added} |")
    return [*lines, ""]


def to_markdown(results: Results) -> str:
    lines = [
        "# Access: what deciding who calls costs the router",
        "",
        ran(results.meta),
        "",
        *_decision(results),
        *(_ways(results) if results.rounds else []),
        *_reviews(results),
        *_probe(results),
        "## Goals",
        "",
        *bullets(goals(results)),
    ]
    return "\n".join(lines) + "\n"


def draw(results: Results, path: Path) -> None:
    """The router's CPU per request by way in (medians), access off's plus the goal as a mark."""
    found = figures(results)
    if not found:
        return
    with panels(path, 1, 1, (6, 4)) as (fig, axes):
        (axis,) = axes[0]
        positions = range(len(found))
        axis.bar(positions, [f.router_cpu_us for f in found], color="#4c72b0")
        off = next((f.router_cpu_us for f in found if f.way == OFF), None)
        if off is not None:
            goal = f"goal: off + {ADDED_CPU_GOAL_US:g} us"
            axis.axhline(off + ADDED_CPU_GOAL_US, color="#c44e52", linestyle="dashed", label=goal)
            axis.legend()
        axis.set_xticks(list(positions), [WAY_NAMES[f.way] for f in found])
        axis.set_ylabel("router CPU per request (us)")
        axis.set_title("what the router spends per request, by way in")
        fig.tight_layout()
