"""The model name of every inference route the router forwards (from the shared table of routes),
no name for anything else, and a model named in a JSON body read with a clear error."""

from __future__ import annotations

import pytest

from batchd.router.directory import DeploymentRef
from batchd.router.errors import BadRequest
from batchd.router.naming import model_in_body, routed, scoped


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
    found = routed("POST", path)
    assert found is not None and found.model_name == model


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models/adder:predict"),
        ("POST", "/v1/models/:predict"),
        ("POST", "/v2/models//infer"),
        ("POST", "/v2/models/a/b/infer"),
        ("POST", "/v2/models/adder"),
        ("POST", "/"),  # the simple call names no model: a Service's, not the router's
        ("GET", "/"),
        ("GET", "/metrics"),
    ],
)
def test_other_requests_name_no_model(method: str, path: str) -> None:
    assert routed(method, path) is None


def test_a_route_that_names_its_model_in_the_body_is_forwarded() -> None:
    found = routed("POST", "/v1/completions")
    assert found is not None and found.model_name is None and found.route.model_field == "model"


def test_the_model_is_read_from_the_bodys_field() -> None:
    assert model_in_body(b'{"model": "gpt", "prompt": "hi"}', "model") == "gpt"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"prompt": "hi"}', "request body: field 'model' must name the model, got None"),
        (b'{"model": 3}', "request body: field 'model' must name the model, got 3"),
        (b'{"model": ""}', "request body: field 'model' must name the model, got ''"),
        (b'["gpt"]', "request body: field 'model' must name the model, got None"),
    ],
)
def test_a_body_without_a_model_name_is_a_bad_request_naming_the_field(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as refused:
        model_in_body(body, "model")
    assert str(refused.value) == message


def test_a_body_that_is_no_json_is_a_bad_request_naming_the_field() -> None:
    with pytest.raises(BadRequest, match=r"request body: not valid JSON .*expected an object naming 'model'"):
        model_in_body(b"{model", "model")


def test_a_deployment_scoped_path_names_the_deployment_and_the_replicas_path() -> None:
    assert scoped("/deployments/ml/minilm/v1/models") == (DeploymentRef("ml", "minilm"), "/v1/models")
    assert scoped("/deployments/ml/minilm/v1/models/x:predict") == (
        DeploymentRef("ml", "minilm"),
        "/v1/models/x:predict",
    )
    for path in ("/deployments/ml/minilm", "/deployments/ml//v1/models", "/deployments//x/y", "/v1/models"):
        assert scoped(path) is None, path
