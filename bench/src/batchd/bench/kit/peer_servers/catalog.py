"""What is compared: the models (and how many clients drive each) and the peers (how each starts and
what it is sent), in one table each; the peers benchmark compares them all, the prefix benchmark
batchd's generator with its cache on and off beside them.

Every server is sent the same bytes for the same model, `{"instances": [item]}`, at the route its
framework gives it; PyTriton alone gets the Open Inference Protocol's body, the only one Triton
reads. batchd runs from the project's own environment, every other peer from its own
(`venvs`), started as `python -m batchd.bench.kit.peer_servers.servers.<module>` with bench/src on its path.

The options of a run (how long, how often) and where servers and load run (`placement`) live
here too."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchd.bench.kit.handlers import TRIVIAL_ADDER
from batchd.bench.kit.peer_servers.servers import models
from batchd.testing.manifests import manifest
from batchd.testing.models import MINILM_SOURCE, SENTENCE

# What every generation request asks to continue (the answer: models.NEW_TOKENS tokens).
PROMPT = "Once upon a time there was a batching server that gathered requests into batches."


@dataclass(frozen=True)
class Model:
    name: str
    title: str
    item: Any  # every request carries this one item
    clients: int  # the closed loop's: each sends its next request when its answer arrives
    # Whether the clients start spread over the warm-up: requests that all take as long would
    # otherwise run in step, and answers come in rounds of every client at once.
    staggered: bool = False
    tokens: int = 0  # new tokens an answer holds (the generator's): its throughput in tokens/s


MODELS: Mapping[str, Model] = {
    "adder": Model("adder", "Trivial adder", 1, 128),
    "minilm": Model("minilm", "MiniLM-L6 embeddings", SENTENCE, 64),
    # As many clients as a batch has rows: a server that batches whole requests runs full batches.
    "gpt2": Model(
        "gpt2",
        f"Tiny GPT-2 generation, {models.NEW_TOKENS} new tokens a request",
        PROMPT,
        32,
        staggered=True,
        tokens=models.NEW_TOKENS,
    ),
}


@dataclass(frozen=True)
class Peer:
    name: str
    title: str
    distribution: str  # whose version the report quotes ("" for batchd: this checkout)
    how: str  # what runs where, in a few words (the report's table)
    module: str = (
        ""  # under batchd.bench.kit.peer_servers.servers ("" for what runs from batchd's environment)
    )
    models: tuple[str, ...] = ("adder", "minilm", "gpt2")  # what it serves
    # The floor is measured beside the peers as a bound, not as one of them: it is never said to
    # be ahead of batchd, nor counted among the peers batchd should pass.
    reference: bool = False

    @property
    def serves_manifest(self) -> bool:
        """Whether the peer is batchd itself, serving a BatchedDeployment's manifest."""
        return self.name in BATCHD_PEERS

    @property
    def own_env(self) -> bool:
        """Whether the peer runs from a virtual environment of its own (all but batchd and the floor)."""
        return bool(self.module)

    def path(self, model: Model) -> str:
        return {
            "batchd": f"/v1/models/{model.name}:predict",
            "unbatched": f"/v1/models/{model.name}:predict",
            "uncached": f"/v1/models/{model.name}:predict",
            "baseline": f"/v1/models/{model.name}:predict",
            "floor": f"/v1/models/{model.name}:predict",  # it answers any path alike
            "minimal": f"/v1/models/{model.name}:predict",  # it answers any path alike
            "mosec": "/inference",
            "litserve": "/predict",
            "ray": "/",
            "bentoml": "/predict",
            "pytriton": f"/v2/models/{model.name}/infer",
        }[self.name]

    def body(self, model: Model) -> bytes:
        if self.name == "pytriton":
            datatype = "INT64" if isinstance(model.item, int) else "BYTES"
            tensor = {"name": "x", "shape": [1, 1], "datatype": datatype, "data": [model.item]}
            return json.dumps({"inputs": [tensor]}).encode()
        return json.dumps({"instances": [model.item]}).encode()

    def command(self, python: Path, model: Model, manifest_path: Path | None = None) -> list[str]:
        """The server's command line, less `--host H --port P` (which every one of them takes)."""
        if self.serves_manifest:  # the baseline's tree comes first on its path
            assert manifest_path is not None
            return [str(python.with_name("batchd")), "serve", str(manifest_path)]
        if self.name == "floor":
            return [str(python), "-m", "batchd.bench.kit.floor"]
        if self.name == "minimal":
            return [str(python), "-m", "batchd.bench.kit.peer_servers.minimal"]
        if self.name == "bentoml":
            return [str(python), "-m", "bentoml", "serve", f"{SERVERS}.{self.module}:Model"]
        return [str(python), "-m", f"{SERVERS}.{self.module}", "--model", model.name]


SERVERS = "batchd.bench.kit.peer_servers.servers"
BATCHD_PEERS = ("batchd", "unbatched", "uncached", "baseline")

PEERS: Mapping[str, Peer] = {
    peer.name: peer
    for peer in (
        Peer(
            "batchd",
            "batchd",
            "",
            "uvicorn (httptools), predictions answered in its protocol (the direct path), "
            "model in the same process",
        ),
        Peer(
            "unbatched",
            "batchd, max_batch_size 1",
            "",
            "batchd as above with batches of one: what batching gains, on the same server",
            reference=True,
        ),
        Peer(
            "uncached",
            "batchd, prefix cache off",
            "",
            "batchd as above with model.generation.prefix_cache_bytes: 0 (the generator only)",
            models=("gpt2",),
            reference=True,
        ),
        Peer(
            "floor",
            "bare uvicorn (floor)",
            "",
            "uvicorn with batchd's settings answering a constant body: no framework, batching or model",
            models=("adder",),
            reference=True,
        ),
        Peer(
            "baseline",
            "batchd (baseline tree)",
            "",
            "batchd from the replica source tree --baseline-src names: a change beside the tree it changes",
            reference=True,
        ),
        Peer(
            "minimal",
            "minimal batching on uvicorn (bound)",
            "",
            "batchd's uvicorn and connection protocol, one future a request, batches of 32 or 10 ms, "
            "the model on a thread: no checks, deadlines, watches or metrics (`kit.peer_servers.minimal`)",
            models=("adder",),
            reference=True,
        ),
        Peer("mosec", "Mosec", "mosec", "Rust HTTP front, model in a Python worker process", "mosec_server"),
        Peer(
            "litserve",
            "LitServe",
            "litserve",
            "FastAPI under uvicorn, model in a worker process fed through queues",
            "litserve_server",
        ),
        Peer(
            "ray",
            "Ray Serve",
            "ray",
            "a local Ray cluster: HTTP proxy actor (uvicorn), replica actor with `@serve.batch`",
            "ray_server",
        ),
        Peer(
            "bentoml",
            "BentoML",
            "bentoml",
            "`bentoml serve`: Starlette under uvicorn, adaptive batching, a worker process",
            "bentoml_service",
        ),
        Peer(
            "pytriton",
            "Triton (PyTriton)",
            "nvidia-pytriton",
            "Triton Inference Server (C++) in front, model in a Python process",
            "pytriton_server",
        ),
    )
}

# Every peer but the baseline, which needs a source tree to run from (`--baseline-src`), and batchd
# without its prefix cache (the prefix benchmark runs it).
DEFAULT_PEERS = tuple(name for name in PEERS if name not in ("baseline", "uncached"))


def batchd_manifest(
    model: Model,
    gpt2_dir: Path | None = None,
    device: str = "cpu",
    batched: bool = True,
    prefix_cache: bool = True,
) -> dict[str, Any]:
    """The BatchedDeployment batchd serves `model` from, with every peer's batching settings (the
    generator: batchd's own default, token-level scheduling, at as many rows as a peer's batch,
    its prefix cache at its default size unless `prefix_cache` is off); unbatched, batches of one
    and no wait."""
    batching = (
        {"max_batch_size": models.MAX_BATCH_SIZE, "batch_wait_timeout_s": models.BATCH_WAIT_S}
        if batched
        else {"max_batch_size": 1, "batch_wait_timeout_s": 0.0}
    )
    if model.name == "adder":
        block: dict[str, Any] = {"name": model.name, "handler": TRIVIAL_ADDER}
    elif model.name == "minilm":
        block = {"name": model.name, "task": "feature-extraction", "source": MINILM_SOURCE, "device": device}
    else:
        assert gpt2_dir is not None, "the generator needs the folder of its tiny GPT-2"
        tokens = models.NEW_TOKENS
        block = {
            "name": model.name,
            "task": "text-generation",
            "source": f"file://{gpt2_dir}",
            "device": device,
            # Greedy, and every answer runs to exactly `tokens` new tokens, as the peers' do.
            "call_kwargs": {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False},
            "generation": {"max_new_tokens": tokens} | ({} if prefix_cache else {"prefix_cache_bytes": 0}),
        }
    return manifest(f"peers-{model.name}", block, batching=batching)


@dataclass(frozen=True)
class Options:
    peers: tuple[str, ...] = DEFAULT_PEERS
    models: tuple[str, ...] = tuple(MODELS)
    repeats: int = 3
    duration_s: float = 10.0  # each measured closed loop
    warmup_s: float = 2.0  # the same load first, not counted (connections, caches, JIT-less warm-up)
    ceiling_s: float = 5.0  # the model alone, each repeat
    # Where the models run: `cuda` on a GPU machine (float16 there, as batchd's `dtype: auto`).
    device: str = "cpu"
    # From start to the first answer: a Ray cluster or a MiniLM worker takes tens of seconds on
    # a busy machine; a server that is not answering by then is reported as not starting.
    ready_timeout_s: float = 240.0
    baseline_src: str | None = None  # the replica source tree the `baseline` peer runs from


def placement() -> tuple[set[int] | None, set[int] | None]:
    """(the servers' cores, the load generator's): on two or more cores, every server process on
    the first and the load on the others, so that neither takes the other's time; else none."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return None, None
    return {available[0]}, set(available[1:])


def describe(server_cores: set[int] | None, load_cores: set[int] | None) -> str:
    """`placement` in words, for a report."""
    if not server_cores or not load_cores:
        return f"no pinning: {len(os.sched_getaffinity(0))} core(s), servers and load share them"
    return (
        f"every server process on core {','.join(map(str, sorted(server_cores)))}, the load generator "
        f"on core {','.join(map(str, sorted(load_cores)))}"
    )
