"""The model name of every inference route the router forwards, and no name for anything else."""

from __future__ import annotations

import pytest

from batchd.router.paths import model_in_path


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("/v1/models/adder:predict", "adder"),
        ("/v2/models/adder/infer", "adder"),
        ("/v2/models/gpt/generate", "gpt"),
        ("/v2/models/gpt/generate_stream", "gpt"),
    ],
)
def test_inference_routes_name_their_model(path: str, model: str) -> None:
    assert model_in_path("POST", path) == model


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models/adder:predict"),
        ("POST", "/v1/models/:predict"),
        ("POST", "/v2/models//infer"),
        ("POST", "/v2/models/a/b/infer"),
        ("POST", "/v2/models/adder"),
        ("POST", "/"),
        ("GET", "/metrics"),
    ],
)
def test_other_requests_name_no_model(method: str, path: str) -> None:
    assert model_in_path(method, path) is None
