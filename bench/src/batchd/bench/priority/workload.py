"""What the priority benchmark sends: the replica, the two subjects and the options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batchd.testing.manifests import manifest

BATCH_S = 0.05
MAX_BATCH = 8
CAPACITY_RPS = MAX_BATCH / BATCH_S  # items a second, whatever the CPU does
SUBJECTS = ("priority", "first_come")
CLASSES = [{"name": "high", "priority": 10}, {"name": "low", "priority": 0}]
PATH = "/v1/models/{model}:predict"
# Room for every client of the fairness load (176), so that none is refused and spins; 2.5 s of work.
QUEUE = 400


@dataclass(frozen=True)
class Options:
    repeats: int = 3
    duration_s: float = 20.0  # each load, measured
    overload: float = 2.0  # the priority load, as a multiple of capacity
    high_share: float = 0.2  # of it, high priority
    # The fairness load: the light caller's closed-loop clients, enough to keep it backlogged (more
    # queued than its half of a batch) ...
    light_clients: int = 16
    heavy_factor: int = 10  # ... and the heavy caller's, this many times more
    grace_s: float = 10.0


QUICK = Options(repeats=1, duration_s=4.0)


def model_name(subject: str) -> str:
    """The subject's deployment and model name (a DNS label: no underscore)."""
    return subject.replace("_", "-")


def subject_manifest(subject: str) -> dict[str, Any]:
    model = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": BATCH_S}}
    batching = {
        "max_batch_size": MAX_BATCH,
        "batch_wait_timeout_s": 0.005,
        "max_queued_requests": QUEUE,
        "priority_classes": CLASSES,
        "default_priority_class": "low",
        "queue_order": "priority" if subject == "priority" else "first_come",
    }
    return manifest(model_name(subject), model, batching=batching)
