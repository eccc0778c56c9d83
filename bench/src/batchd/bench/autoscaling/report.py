"""autoscaling.md: the load step's figures for both subjects, and the calibration."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from batchd.bench.autoscaling.calibration import calibration_markdown
from batchd.bench.autoscaling.options import SUBJECTS
from batchd.bench.autoscaling.results import AUTOSCALING_ONLY, FIGURES, Calibration, Results, StepResult
from batchd.bench.kit import records
from batchd.bench.kit.formatting import figure, with_unit
from batchd.bench.kit.records import ran


def _figure(value: float | None, unit: str = "") -> str:
    """A figure as the report prints it; None is a time that never came."""
    return "never" if value is None else with_unit(figure(value), unit)


def step_markdown(step: StepResult) -> str:
    o = step.options
    s = o.step
    lines = [
        "## Load step: autoscaled vs one fixed replica",
        "",
        f"Handler: SlowAdder, {o.batch_s} s per batch of up to {o.max_batch_size} "
        f"(one replica serves at most {o.capacity_rps:.0f} items/s), batch wait {o.batch_wait_s} s, "
        f"max_queued_requests {o.max_queued}. Traffic (open loop, one item per request): "
        f"{s.low_rps:g} req/s for {s.before_s:g} s, {s.high_rps:g} req/s "
        f"({s.high_rps / o.capacity_rps:.1f}x one replica) for {s.step_s:g} s, "
        f"{s.low_rps:g} req/s for {s.after_s:g} s. Autoscaled: min {o.min_replicas}, "
        f"max {o.max_replicas}, target_ongoing_items {o.target_ongoing_items} (the default), "
        f"upscale_delay_s {o.upscale_delay_s:g}, downscale_delay_s {o.downscale_delay_s:g}; "
        f"the operator polls every {o.poll_s:g} s (its default is 5 s); preStop sleep "
        f"{o.drain_delay_s} s. Medians of {o.repeats} interleaved repeats (each repeat's "
        "values in brackets).",
        "",
        f"Definitions: *p99* counts requests answered 200, by the moment they were sent (503s are "
        f"answered at once and counted apart). *load carried*: the first moment after which the p99 "
        f"over a sliding {o.window_s:g} s window stays under {o.carry_factor:g}x the p99 "
        f"before the step until the step ends (samples every {o.sample_s:g} s). *ready capacity >= "
        f"offered*: ready replicas x {o.capacity_rps:.0f} items/s >= {s.high_rps:g} req/s. "
        f"*queue under target*: the first moment after which the total queue stays at or under "
        f"{o.target_ongoing_items} items per ready replica until the step ends. "
        "*never*: not before the step ended. "
        "*Without a usable answer*: neither a 2xx nor a 503 with Retry-After (must be 0).",
        "",
        "| figure | autoscaled | fixed (1 replica) |",
        "|---|---:|---:|",
    ]
    for key, label, unit in FIGURES:
        cells = []
        for subject in SUBJECTS:
            if subject == "fixed" and key in AUTOSCALING_ONLY:
                cells.append("n/a")
                continue
            median = step.summary[subject][key]
            text = _figure(median.value, unit)
            if len(median.runs) > 1:
                text += " (" + ", ".join(_figure(v) for v in median.runs) + ")"
            cells.append(text)
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def to_markdown(results: Results) -> str:
    parts = ["# Autoscaling benchmark\n"]
    if results.step is not None:
        parts += [
            ran(results.step.meta) + "\n",
            step_markdown(results.step),
            "![load step](autoscaling.png)\n",
        ]
    if results.calibration is not None:
        parts += [ran(results.calibration.meta) + "\n", calibration_markdown(results.calibration)]
    return "\n".join(parts)


def read_results(path: Path) -> Results:
    """autoscaling.json as written before (nothing if absent; a section it cannot read is left out)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    step, calibration = None, None
    with contextlib.suppress(TypeError, KeyError, ValueError):
        step = records.from_json(StepResult, data["step"])
    with contextlib.suppress(TypeError, KeyError, ValueError):
        calibration = records.from_json(Calibration, data["calibration"])
    return Results(step, calibration)


def write_results(output_dir: Path, new: Results) -> Results:
    """The sections of `new` over those autoscaling.json had, written with autoscaling.md from
    both: the two modes run separately but report together."""
    before = read_results(output_dir / "autoscaling.json")
    results = Results(new.step or before.step, new.calibration or before.calibration)
    records.publish(output_dir, "autoscaling", results, to_markdown(results))
    return results
