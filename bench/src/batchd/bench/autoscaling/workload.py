"""What the autoscaling benchmark runs: the load step, its options, the subjects and their
manifests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batchd.testing.manifests import manifest

HANDLER = "batchd.testing.batch_handlers:SlowAdder"
SUBJECTS = ("autoscaled", "fixed")
START_TIMEOUT_S = 120.0  # a replica's first start on a busy machine


@dataclass(frozen=True)
class Step:
    """The traffic: `low_rps` for `before_s`, `high_rps` for `step_s`, `low_rps` for `after_s`."""

    low_rps: float
    high_rps: float
    before_s: float
    step_s: float
    after_s: float

    @property
    def start_s(self) -> float:
        return self.before_s

    @property
    def end_s(self) -> float:
        return self.before_s + self.step_s

    @property
    def duration_s(self) -> float:
        return self.before_s + self.step_s + self.after_s

    def rate(self, elapsed_s: float) -> float:
        return self.high_rps if self.start_s <= elapsed_s < self.end_s else self.low_rps


@dataclass(frozen=True)
class Options:
    repeats: int = 3
    max_batch_size: int = 8
    batch_s: float = 0.1  # SlowAdder's hold per batch: 8 / 0.1 = 80 items/s per replica
    batch_wait_s: float = 0.02
    max_queued: int = 1024  # the spec's default: what a user gets
    min_replicas: int = 1
    max_replicas: int = 6  # 6 x 80 = 480 items/s: room above the 320 of the step
    upscale_delay_s: float = 2.0
    downscale_delay_s: float = 10.0
    poll_s: float = 0.5  # the operator's replica_poll_interval_s (its default is 5 s)
    drain_delay_s: int = 1  # the preStop sleep (default 5 s): endpoints drop a pod first
    step: Step = Step(low_rps=20, high_rps=320, before_s=10, step_s=40, after_s=20)
    sample_s: float = 0.5
    window_s: float = 2.0  # the sliding window of the p99
    carry_factor: float = 2.0  # "carried": windowed p99 under this x the idle p99

    @property
    def capacity_rps(self) -> float:
        """What one replica serves at most: full batches back to back."""
        return self.max_batch_size / self.batch_s

    @property
    def target_ongoing_items(self) -> int:
        """The autoscaler's default aim: one batch per batch slot (one slot here)."""
        return self.max_batch_size


QUICK = Options(
    repeats=1,
    upscale_delay_s=1.0,
    downscale_delay_s=3.0,
    step=Step(low_rps=20, high_rps=320, before_s=2, step_s=10, after_s=4),
)


def subject_manifest(subject: str, options: Options) -> dict[str, Any]:
    model = {"handler": HANDLER, "init_kwargs": {"delay_s": options.batch_s}}
    batching = {
        "max_batch_size": options.max_batch_size,
        "batch_wait_timeout_s": options.batch_wait_s,
        "max_queued_requests": options.max_queued,
    }
    if subject == "fixed":
        return manifest(subject, model, batching=batching, num_replicas=1)
    autoscaling = {
        "min_replicas": options.min_replicas,
        "max_replicas": options.max_replicas,
        "upscale_delay_s": options.upscale_delay_s,
        "downscale_delay_s": options.downscale_delay_s,
    }
    return manifest(subject, model, batching=batching, num_replicas=1, autoscaling=autoscaling)
