"""A real Open Inference Protocol client, tritonclient.http, reading the V2 model metadata and
sending what it says, in JSON and with its default binary tensor data, both ways."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from batchd.api.manifest import parse_manifest
from batchd.replica.front.app import create_app
from batchd.replica.settings import ReplicaSettings
from batchd.testing.manifests import manifest
from batchd.testing.models import MINILM_SOURCE, minilm_mirror
from batchd.testing.servers import replica_process, uvicorn_in_thread, write_manifest

NUMPY = {
    "INT32": np.int32,
    "INT64": np.int64,
    "FP32": np.float32,
    "FP64": np.float64,
    "BOOL": np.bool_,
    "BYTES": np.object_,
}


def serve(document: dict[str, Any]) -> Iterator[triton.InferenceServerClient]:
    with uvicorn_in_thread(create_app(parse_manifest(document), ReplicaSettings())) as url:
        client = triton.InferenceServerClient(url.removeprefix("http://"))
        try:
            yield client
        finally:
            client.close()


@pytest.fixture(scope="module")
def typed() -> Iterator[triton.InferenceServerClient]:
    yield from serve(manifest("typed", "batchd.testing.batch_handlers:add_one"))


@pytest.fixture(scope="module")
def declared() -> Iterator[triton.InferenceServerClient]:
    model = {
        "handler": "batchd.testing.batch_handlers:untyped_double",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
        "outputs": [{"name": "doubled", "datatype": "FP32", "shape": [-1]}],
    }
    yield from serve(manifest("declared", model))


@pytest.fixture(scope="module")
def rows() -> Iterator[triton.InferenceServerClient]:
    model = {
        "handler": "batchd.testing.batch_handlers:untyped_row_sums",
        "inputs": [{"name": "row", "datatype": "INT32", "shape": [-1, 3]}],
        "outputs": [{"name": "sum", "datatype": "INT64", "shape": [-1]}],
    }
    yield from serve(manifest("rows", model))


def infer_as_metadata_says(
    client: triton.InferenceServerClient, name: str, data: np.ndarray[Any, Any], binary: bool
) -> tuple[dict[str, Any], Any]:
    """What a tritonclient user writes: read the metadata, send its input, read its output."""
    metadata = client.get_model_metadata(name)
    (spec,) = metadata["inputs"]
    (output,) = metadata["outputs"]
    tensor = triton.InferInput(spec["name"], list(data.shape), spec["datatype"])
    tensor.set_data_from_numpy(data.astype(NUMPY[spec["datatype"]]), binary_data=binary)
    requested = triton.InferRequestedOutput(output["name"], binary_data=binary)
    result = client.infer(name, [tensor], outputs=[requested])
    return metadata, result.as_numpy(output["name"])


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_a_typed_handler_is_described_by_its_annotation(
    typed: triton.InferenceServerClient, binary: bool
) -> None:
    metadata, answer = infer_as_metadata_says(typed, "typed", np.array([1, 2, 3]), binary)
    assert [spec["datatype"] for spec in metadata["inputs"] + metadata["outputs"]] == ["INT64", "INT64"]
    assert answer.dtype == np.int64 and answer.tolist() == [2, 3, 4]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_an_untyped_handler_is_described_by_the_declared_inputs(
    declared: triton.InferenceServerClient, binary: bool
) -> None:
    metadata, answer = infer_as_metadata_says(declared, "declared", np.array([1.5, -2.0, 4.25]), binary)
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1]}]
    assert answer.dtype == np.float32 and answer.tolist() == [3.0, -4.0, 8.5]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_rows_of_a_two_dimensional_input_are_the_batch_items(
    rows: triton.InferenceServerClient, binary: bool
) -> None:
    _, answer = infer_as_metadata_says(rows, "rows", np.array([[1, 2, 3], [10, 20, 30]]), binary)
    assert answer.tolist() == [6, 60]


def test_the_default_request_asks_for_binary_outputs(declared: triton.InferenceServerClient) -> None:
    tensor = triton.InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))  # binary_data=True by default
    result = declared.infer("declared", [tensor])  # no outputs named: all of them, binary
    assert result.get_output("doubled")["parameters"]["binary_data_size"] == 8
    assert result.as_numpy("doubled").tolist() == [2.0, 4.0]


def test_bad_binary_data_is_refused_naming_the_tensor(declared: triton.InferenceServerClient) -> None:
    tensor = triton.InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    tensor.set_shape([3])  # three promised, two sent
    with pytest.raises(InferenceServerException, match=r"inputs\[0\].data: shape \[3\] needs 3 element"):
        declared.infer("declared", [tensor])
    assert declared.is_server_live()


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[triton.InferenceServerClient]:
    tmp: Path = tmp_path_factory.mktemp("minilm")
    mirror = minilm_mirror(tmp / "mirror")
    model = {"task": "feature-extraction", "source": MINILM_SOURCE, "device": "cpu"}
    path = write_manifest(tmp, manifest("minilm", model))
    with replica_process(path, tmp, env={"BATCHD_MODEL_MIRROR": str(mirror)}) as replica:
        client = triton.InferenceServerClient(replica.url.removeprefix("http://"))
        try:
            yield client
        finally:
            client.close()


@pytest.mark.slow
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_minilm_embeddings_come_back_as_fp32_tensors(
    minilm: triton.InferenceServerClient, binary: bool
) -> None:
    texts = np.array([b"A man is eating food.", b"The stock market fell sharply today."], dtype=np.object_)
    metadata, vectors = infer_as_metadata_says(minilm, "minilm", texts, binary)
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    assert vectors.dtype == np.float32 and vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)  # normalised, as the model says
