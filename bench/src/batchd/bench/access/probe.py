"""The cache probe, timed: tenant B sends a prompt tenant A has cached (claiming A's caller and
tenant in every header it may write), against B's own fresh prompts, through the router to a
`batchd serve` replica of a tiny GPT-2 with a prefix cache. Were A's blocks any use to B, B's probe
would answer sooner than a fresh prompt of the same length; `cached_tokens` says whether they were."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from batchd.bench.access.analysis import Probe
from batchd.testing.kubernetes.routed import SIGNING_KEY, RouterNamespaces
from batchd.testing.manifests import manifest
from batchd.testing.models import build_gpt2
from batchd.testing.servers import ServerProcess, start_replica, write_manifest
from batchd.testing.waiting import eventually_async

CHAT = "chat"
KEYS = {"alpha": ["alpha-bench-key-0123456789abcdef0123"], "beta": ["beta-bench-key-0123456789abcdef01234"]}
SENTENCE = "The quarterly figures of the confidential merger, line by line: "
FORGED = {"batchd-fairness-id": "a", "batchd-tenant": "alpha"}
ACCESS = {"tenants": [{"name": t, "api_keys_secret": f"{t}-keys"} for t in KEYS]}
BATCHING = {"max_batch_size": 4}


def _prompt(n: int) -> str:
    return f"{n}: {SENTENCE * 3}"  # every prompt the same length in tokens, give or take its number


async def _complete(
    client: httpx.AsyncClient, url: str, key: str, prompt: str, **headers: str
) -> tuple[float, int]:
    body = {"model": CHAT, "prompt": prompt, "max_tokens": 1, "temperature": 0, "user": "a"}
    started = time.perf_counter()
    answer = await client.post(url, json=body, headers={"authorization": f"Bearer {key}", **headers})
    elapsed = time.perf_counter() - started
    answer.raise_for_status()
    return elapsed, int(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def build_probe_model(workdir: Path) -> Path:
    """The replica's tiny GPT-2, with room for the probe's prompts."""
    return build_gpt2(workdir / "gpt2", n_positions=512)


@dataclass(frozen=True)
class ProbeReplica:
    """The probe's `batchd serve` replica (started, not waited on), and the model block it serves."""

    process: ServerProcess
    model: dict[str, Any]


def start_probe_replica(source: Path, host: str, workdir: Path, threads: int | None) -> ProbeReplica:
    """The replica of the model built at `source`, listening on `host` (the cluster's address, for a
    slice to name it); `threads`: torch's (None: its own choice)."""
    key_file = workdir / "signing-key"
    key_file.write_bytes(SIGNING_KEY)  # the key of the access Secret the router reads
    model = {
        "task": "text-generation",
        "source": f"file://{source}",
        "device": "cpu",
        "generation": {"prefix_cache_bytes": 16 << 20},
    }
    env = {"BATCHD_SIGNING_KEY_FILE": str(key_file)}
    if threads is not None:
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    process = start_replica(
        write_manifest(workdir, manifest(CHAT, model, batching=BATCHING, access=ACCESS)),
        workdir / "logs",
        env=env,
        host=host,
    )
    return ProbeReplica(process, model)


async def run_probe(
    tries: int, namespaces: RouterNamespaces, router_url: str, replica: ProbeReplica
) -> Probe:
    """`tries` of (alpha caches prompt i; beta probes it; beta sends a fresh prompt), interleaved,
    through the router at `router_url` (which reads `namespaces`) to `replica`, once it is ready."""
    process = replica.process
    await asyncio.to_thread(process.wait_ready, 180.0)
    namespaces.put_access_secret(CHAT, KEYS)
    await namespaces.create_deployment(CHAT, serves=replica.model, batching=BATCHING, access=ACCESS)
    await namespaces.put_slice(namespaces.slice(CHAT, [f"{process.host}:{process.port}"]))
    url = f"{router_url}/v1/completions"
    alpha, beta = KEYS["alpha"][0], KEYS["beta"][0]
    async with httpx.AsyncClient(timeout=60) as client:

        async def warm() -> bool:
            try:
                await _complete(client, url, beta, _prompt(-1))
            except httpx.HTTPStatusError:
                return False  # the router has not read the deployment or its Secret yet
            return True

        await eventually_async(warm, timeout_s=60.0, what="the router serving the chat deployment")
        probes, fresh, hits, controls = [], [], 0, 0
        for n in range(tries):
            await _complete(client, url, alpha, _prompt(n))
            controls += (await _complete(client, url, alpha, _prompt(n)))[1] > 0
            elapsed, cached = await _complete(client, url, beta, _prompt(n), **FORGED)
            probes.append(elapsed)
            hits += cached > 0
            fresh.append((await _complete(client, url, beta, _prompt(tries + n)))[0])
    return Probe(tries, controls, hits, probes, fresh)
