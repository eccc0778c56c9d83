"""The house-price model of Ray Serve's dynamic-batching guide (examples/house_price.py,
examples/house-price.yaml) served for real.

The model is built here (torch, synthetic districts, about a second) and served by `batchd serve`
from the example manifest as written (max_batch_size 32, a 100 ms window), pointed at the built
file. Clients send what the guide's clients send: feature vectors (KServe V1), and an FP32 [N, 8]
tensor from tritonclient (Open Inference V2, binary tensor data). The replica's own /metrics
show the batches that formed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
import yaml

from batchd.testing import ROOT
from batchd.testing.promtext import Histogram, parse_histogram
from batchd.testing.servers import ServerProcess, replica_process, write_manifest
from examples import house_price

pytestmark = pytest.mark.slow

MAX_BATCH = 32


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("house-price")
    model_path = house_price.build(directory / "house_price_model.pt")
    document = yaml.safe_load((ROOT / "examples" / "house-price.yaml").read_text())
    assert document["spec"]["batching"]["max_batch_size"] == MAX_BATCH
    assert document["spec"]["batching"]["batch_wait_timeout_s"] == 0.1
    document["spec"]["model"]["init_kwargs"]["model_path"] = str(model_path)
    with replica_process(write_manifest(directory, document), directory / "logs") as replica:
        yield replica


def batch_sizes(replica: ServerProcess) -> Histogram:
    return parse_histogram(replica.metrics(), "batchd_batch_size")


def close_to_truth(features: np.ndarray, prices: list[float]) -> None:
    truth = np.array([house_price.true_price(row) for row in features.tolist()])
    relative = np.abs(np.array(prices) - truth) / truth
    assert relative.mean() < 0.02 and relative.max() < 0.1, relative


async def test_feature_vectors_over_v1_are_batched_up_to_32(served: ServerProcess) -> None:
    districts = house_price.districts(96, seed=2).numpy()
    before = batch_sizes(served)
    url = f"{served.url}/v1/models/house-price:predict"
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=96), timeout=30) as client:
        answers = await asyncio.gather(
            *(client.post(url, json={"instances": [row.tolist()]}) for row in districts)
        )
    assert {answer.status_code for answer in answers} == {200}
    close_to_truth(districts, [answer.json()["predictions"][0] for answer in answers])

    batches = batch_sizes(served).minus(before)
    assert batches.sum == 96
    assert batches.mean > 4, batches.distribution()  # the requests were predicted together ...
    at_most_32 = dict(batches.buckets)[MAX_BATCH]
    assert at_most_32 == batches.count  # ... never more than max_batch_size at once


async def test_fp32_tensors_over_v2_from_tritonclient_are_batched_across_requests(
    served: ServerProcess,
) -> None:
    host = served.url.removeprefix("http://")
    with triton.InferenceServerClient(host) as metadata_client:
        metadata = metadata_client.get_model_metadata("house-price")
    assert metadata["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 8]}]

    requests = [house_price.districts(4, seed=10 + n).numpy().astype(np.float32) for n in range(8)]
    before = batch_sizes(served)
    client = triton_aio.InferenceServerClient(host)
    try:

        async def infer(features: np.ndarray) -> np.ndarray:
            tensor = triton.InferInput("features", list(features.shape), "FP32")
            tensor.set_data_from_numpy(features)  # binary tensor data, tritonclient's default
            output = triton.InferRequestedOutput("price", binary_data=True)
            result = await client.infer("house-price", [tensor], outputs=[output])
            prices: np.ndarray = result.as_numpy("price")
            return prices

        answers = await asyncio.gather(*(infer(features) for features in requests))
    finally:
        await client.close()
    for features, prices in zip(requests, answers, strict=True):
        assert prices.shape == (4,) and prices.dtype == np.float32
        close_to_truth(features, prices.tolist())

    batches = batch_sizes(served).minus(before)
    assert batches.sum == 32
    # Requests of 4 rows each, yet batches larger than 4: rows of several requests shared a batch.
    assert batches.count < 8 and batches.mean > 4, batches.distribution()


def test_a_feature_vector_of_the_wrong_length_is_refused_naming_it(served: ServerProcess) -> None:
    good = house_price.districts(1).tolist()[0]
    answer = httpx.post(
        f"{served.url}/v1/models/house-price:predict", json={"instances": [good, [1.0, 2.0, 3.0]]}, timeout=10
    )
    assert answer.status_code == 400
    assert "instances[1]: List should have at least 8 items" in answer.json()["error"]
