"""What the rollouts benchmark ships: the subjects, their manifests and the options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batchd.testing.kubernetes import handlers
from batchd.testing.manifests import manifest, revision

NAME = "shop"
SUBJECTS = ("rolling", "canary", "canary-good")
START_TIMEOUT_S = 150.0  # a replica's start on a busy machine
# One item a batch: an item that fails is its own batch.
BATCHING = {"max_batch_size": 1, "batch_wait_timeout_s": 0, "max_queued_requests": 256}


@dataclass(frozen=True)
class Options:
    repeats: int = 1
    rate: float = 40.0  # requests a second through the router
    before_s: float = 20.0  # of the load before the ship: the steady p99
    after_s: float = 120.0  # of the load after a bad revision's ship
    promote_timeout_s: float = 300.0  # the good revision's promotion, at most
    fail_percent: int = 30
    first_percent: int = 10
    hold_s: float = 20.0  # each canary step
    interval_s: float = 5.0  # the analysis
    min_requests: int = 20
    poll_s: float = 0.5  # the operator's replica_poll_interval_s
    sample_s: float = 1.0  # the canary's share, read from the status this often


QUICK = Options(before_s=5.0, after_s=40.0, hold_s=5.0, interval_s=2.0, min_requests=10)


def subject_manifest(subject: str, options: Options, version: int) -> dict[str, Any]:
    """The resource as shipped: `version` 1 is the stable revision every subject starts from."""
    bad = version > 1 and subject != "canary-good"
    rollout: dict[str, Any] = {"strategy": "rolling"}
    if subject != "rolling":
        rollout = {
            "strategy": "canary",
            "steps": [
                {"traffic_percent": options.first_percent, "hold_s": options.hold_s},
                {"traffic_percent": 50, "hold_s": options.hold_s},
            ],
            "analysis": {"min_requests": options.min_requests, "interval_s": options.interval_s},
        }
    model = revision(version, fail_percent=options.fail_percent if bad else 0)
    return manifest(NAME, model, batching=BATCHING, rollout=rollout, **handlers.pod_spec())
