"""The three benchmark scenarios, and the manifests and requests each one serves.

(1) `trivial`: the example adder (examples/adder.py) without its sleep, max_batch_size 32:
    what the server costs.
(2) `minilm`: sentence embeddings with the bundled all-MiniLM-L6-v2, max_batch_size 32, 10 ms wait:
    a real encoder, where batching pays.
(3) `gpt2`: a tiny GPT-2 built here, 16 new tokens, max_batch_size 8: text generation, with
    request-level batching (the batcher and the pipeline, against `generate` alone as the ceiling;
    token-level batching has its own benchmark, `python -m batchd.bench.generation`).

Each scenario is served twice (batched, and with `max_batch_size: 1`) beside the bare-uvicorn
floor, and its model is measured alone (the ceiling) in the same run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchd.testing.manifests import manifest
from batchd.testing.models import MINILM_SOURCE, SENTENCE, build_gpt2, minilm_mirror, minilm_path

# Greedy, and exactly 16 new tokens whatever the model says: the ceiling and the servers make the
# same tokens for the same prompt (the harness checks their answers are identical).
GPT2_CALL_KWARGS: dict[str, Any] = {"max_new_tokens": 16, "min_new_tokens": 16, "do_sample": False}


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    max_batch_size: int
    batch_wait_timeout_s: float
    item: Any  # every request carries this one instance
    ceiling_kind: str | None  # "embeddings" | "generation" | None (no model to measure alone)
    # Cores for the server (and the ceiling) and for the load generator; None = not pinned.
    server_cores: set[int] | None
    client_cores: set[int] | None
    call_kwargs: dict[str, Any] = field(default_factory=dict)

    def model_block(self, assets: Path) -> dict[str, Any]:
        if self.name == "trivial":
            return {"handler": "batchd.bench.kit.handlers:TrivialAdder.handle_batch", "device": "cpu"}
        if self.name == "minilm":
            return {"task": "feature-extraction", "source": MINILM_SOURCE, "device": "cpu"}
        return {
            "task": "text-generation",
            "source": f"file://{assets / 'tiny-gpt2'}",
            "device": "cpu",
            "call_kwargs": self.call_kwargs,
            "generation": {"scheduling": "request"},
        }

    def manifest(self, assets: Path, batched: bool) -> dict[str, Any]:
        name = f"{self.name}-{'batched' if batched else 'unbatched'}"
        return manifest(
            name,
            {"name": self.name, **self.model_block(assets)},
            batching={
                "max_batch_size": self.max_batch_size if batched else 1,
                "batch_wait_timeout_s": self.batch_wait_timeout_s if batched else 0.0,
                "max_queued_requests": 4096,
                "request_timeout_s": 60,
            },
        )

    def body(self) -> bytes:
        return json.dumps({"instances": [self.item]}).encode()

    @property
    def path(self) -> str:
        return f"/v1/models/{self.name}:predict"


def _cores() -> tuple[set[int] | None, set[int] | None]:
    """On two or more cores: the server on the last one, the load generator on the others."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return None, None
    return {available[-1]}, set(available[:-1])


def all_scenarios() -> dict[str, Scenario]:
    server_core, client_cores = _cores()
    return {
        # Overhead: the server gets one core and the load generator the other, so neither
        # starves the other and the server's per-request cost is what is measured.
        "trivial": Scenario(
            "trivial",
            "Trivial handler (the example adder, no sleep)",
            32,
            0.0,
            1,
            None,
            server_core,
            client_cores,
        ),
        # Models: the replica is given every core (as Ray Serve is, in the numbers it is compared with);
        # the load generator is lean and its own CPU time is reported.
        "minilm": Scenario(
            "minilm", "MiniLM-L6 sentence embeddings", 32, 0.01, SENTENCE, "embeddings", None, None
        ),
        "gpt2": Scenario(
            "gpt2",
            "Tiny GPT-2, 16 new tokens",
            8,
            0.01,
            "Once upon a time",
            "generation",
            None,
            None,
            dict(GPT2_CALL_KWARGS),
        ),
    }


def prepare_assets(scenario: Scenario, assets: Path) -> dict[str, str]:
    """Build what the scenario's model needs on disk; returns the environment the replica needs."""
    if scenario.name == "minilm":
        return {"BATCHD_MODEL_MIRROR": str(minilm_mirror(assets / "mirror"))}
    if scenario.name == "gpt2":
        if not (assets / "tiny-gpt2" / "config.json").exists():
            build_gpt2(assets / "tiny-gpt2")
        # One torch thread for the servers and the ceiling alike. With two on these two shared
        # cores, OpenMP threads spinning against other processes made the same generate call take
        # from 46 ms to 400 ms from one run to the next, and one 3 s ceiling window against
        # another decided whether the server seemed above it; with one, runs agree.
        return {"OMP_NUM_THREADS": "1"}
    return {}


def model_dir(scenario: Scenario, assets: Path) -> Path:
    return minilm_path() if scenario.name == "minilm" else assets / "tiny-gpt2"
