"""What the priority benchmark sends: the replicas, the two subjects and the options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchd.testing.manifests import manifest

BATCH_S = 0.05
MAX_BATCH = 8
CAPACITY_RPS = MAX_BATCH / BATCH_S  # items a second, whatever the CPU does
SUBJECTS = ("priority", "first_come")
# `gold` and `silver` are equals: one level, served in turns under priority order.
CLASSES = [
    {"name": "high", "priority": 10},
    {"name": "gold", "priority": 5},
    {"name": "silver", "priority": 5},
    {"name": "low", "priority": 0},
]
PATH = "/v1/models/{model}:predict"
# Room for every client of the fairness load (176), so that none is refused and spins; 2.5 s of work.
QUEUE = 400

# Token-level generation: the tiny GPT-2, four rows and room for eight waiting sequences; a high
# class and a sheddable one (the default).
GENERATION_CLASSES = [{"name": "high", "priority": 10}, {"name": "bulk", "priority": -1}]
GENERATION_ROWS = 4
GENERATION_QUEUE = 8
GENERATION_PATH = "/v2/models/{model}/generate_stream"
HIGH_PROMPT = "The quick brown fox jumps over the lazy dog while the model computes its answer."
BULK_PROMPT = "Batching amortises the cost of a forward pass."


@dataclass(frozen=True)
class Options:
    repeats: int = 3
    duration_s: float = 20.0  # the priority and fairness loads, measured
    # The replica's queue (`max_queued_requests`): the overloads fill it before the first 503, and
    # what it holds at the end is answered before a load ends.
    queue: int = QUEUE
    overload: float = 2.0  # the priority load, as a multiple of capacity
    high_share: float = 0.2  # of it, high priority
    # The fairness load: the light caller's closed-loop clients, enough to keep it backlogged (more
    # queued than its half of a batch) ...
    light_clients: int = 16
    heavy_factor: int = 10  # ... and the heavy caller's, this many times more
    fairness_warmup_s: float = 1.0  # both callers backlogged before it counts
    grace_s: float = 10.0
    mix_s: float = 10.0  # the equal, dead-item and generation loads, measured
    equal_overload: float = 3.0  # the equal classes together, as a multiple of capacity
    # The dead-item load: the high class's closed-loop clients (enough to keep every batch full) and
    # a low class at this multiple of capacity whose requests give up after `dead_timeout_s`.
    dead_high_clients: int = 64
    dead_low_share: float = 1.0
    dead_timeout_s: float = 0.2
    # The generation load: the high class's streamed requests a second (Poisson, short answers)
    # beside the sheddable class's closed-loop clients (long answers): twice what the replica holds.
    generation: bool = True
    generation_high_rps: float = 8.0
    generation_bulk_clients: int = 2 * (GENERATION_ROWS + GENERATION_QUEUE // 2)
    generation_high_tokens: int = 8
    generation_bulk_tokens: int = 64
    # Every load waits until every replica is up: none runs beside the generation replicas' start
    # (the smoke's first subject's do, on a machine of few cores) ...
    quiet_start: bool = True
    first_subject: str = SUBJECTS[0]  # ... the subject that goes first in the first repeat


# Smoke-sized: every load, shorter. A queue of 96 fills in 0.6 s at twice the capacity and drains
# as fast (400: 2.5 s each way), so a second of the priority load sees 503s; it still holds every
# client of the fairness load (8 light clients keep their half of a batch backlogged), and the
# dead-item load's high clients (24 still keep every batch full) beside the low class's live
# requests. First come's loads run while the generation replicas start: what the smoke checks of
# them is counts (503s), not latencies.
QUICK = Options(
    repeats=1,
    duration_s=1.0,
    queue=96,
    light_clients=8,
    fairness_warmup_s=0.5,
    mix_s=1.0,
    dead_high_clients=24,
    quiet_start=False,
    first_subject="first_come",
)


def model_name(subject: str) -> str:
    """The subject's deployment and model name (a DNS label: no underscore)."""
    return subject.replace("_", "-")


def queue_order(subject: str) -> str:
    return "priority" if subject == "priority" else "first_come"


def subject_manifest(subject: str, queue: int = QUEUE) -> dict[str, Any]:
    model = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": BATCH_S}}
    batching = {
        "max_batch_size": MAX_BATCH,
        "batch_wait_timeout_s": 0.005,
        "max_queued_requests": queue,
        "priority_classes": CLASSES,
        "default_priority_class": "low",
        "queue_order": queue_order(subject),
    }
    return manifest(model_name(subject), model, batching=batching)


def generation_name(subject: str) -> str:
    return f"tg-{model_name(subject)}"


def generation_manifest(subject: str, model_dir: Path, max_new_tokens: int) -> dict[str, Any]:
    model = {
        "task": "text-generation",
        "source": f"file://{model_dir}",
        "device": "cpu",
        "generation": {"max_new_tokens": max_new_tokens},
    }
    batching = {
        "max_batch_size": GENERATION_ROWS,
        "max_queued_requests": GENERATION_QUEUE,
        "request_timeout_s": 60,
        "priority_classes": GENERATION_CLASSES,
        "default_priority_class": "bulk",
        "queue_order": queue_order(subject),
    }
    return manifest(generation_name(subject), model, batching=batching)
