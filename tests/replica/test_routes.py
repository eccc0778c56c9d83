"""The one table of inference routes: what it matches, that the replica binds every route, and that
the OpenAPI document describes each from the same table."""

from __future__ import annotations

import re

import pytest

from batchd.api.manifest import parse_manifest
from batchd.api.routes import INFERENCE_ROUTES, Route, RouteMatch, RouteTable
from batchd.replica.front.app import create_app
from batchd.replica.front.protocols import ENDPOINTS
from batchd.replica.settings import ReplicaSettings
from batchd.testing.manifests import manifest


@pytest.mark.parametrize(
    ("method", "path", "operation", "name"),
    [
        ("POST", "/v1/models/adder:predict", "kserve_v1_predict", "adder"),
        ("POST", "/v2/models/adder/infer", "v2_infer", "adder"),
        ("POST", "/v2/models/gpt/generate", "v2_generate", "gpt"),
        ("POST", "/v2/models/gpt/generate_stream", "v2_generate_stream", "gpt"),
        ("POST", "/v2/models/org/name/infer", "v2_infer", "org/name"),
        ("GET", "/", "simple_call_get", None),
        ("POST", "/", "simple_call_post", None),
    ],
)
def test_a_request_finds_its_route_and_model_name(
    method: str, path: str, operation: str, name: str | None
) -> None:
    found = RouteTable().match(method, path)
    assert found is not None and (found.route.operation, found.model_name) == (operation, name)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models/adder:predict"),
        ("POST", "/v2/models/adder"),
        ("GET", "/v2/health/ready"),
        ("PUT", "/"),
    ],
)
def test_other_requests_are_no_inference_route(method: str, path: str) -> None:
    assert RouteTable().match(method, path) is None


def test_a_route_goes_before_a_broader_one_whatever_the_order_of_the_table() -> None:
    broad, narrow = Route("model", "POST", "/m/{name}"), Route("infer", "POST", "/m/{name}/infer")
    for routes in ([broad, narrow], [narrow, broad]):
        table = RouteTable(routes)
        assert table.match("POST", "/m/x/infer") == RouteMatch(narrow, "x")
        assert table.match("POST", "/m/x") == RouteMatch(broad, "x")


def test_a_route_with_two_parameters_or_a_repeated_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"route 'bad': path '/v2/\{name\}/\{version\}'"):
        Route("bad", "POST", "/v2/{name}/{version}")
    with pytest.raises(ValueError, match=re.escape("POST /v2/models/{name}/infer is also 'v2_infer'")):
        RouteTable([*INFERENCE_ROUTES, Route("again", "POST", "/v2/models/{name}/infer")])


def test_a_route_names_its_model_in_the_path_or_in_the_body_not_both() -> None:
    completions = Route("completions", "POST", "/v1/completions", model_field="model")
    found = RouteTable([completions]).match("POST", "/v1/completions")
    assert found == RouteMatch(completions, None) and found.route.model_field == "model"
    with pytest.raises(ValueError, match="model_field='model' would name it twice"):
        Route("both", "POST", "/v2/models/{name}/infer", model_field="model")


def test_the_replica_binds_every_route_once() -> None:
    assert sorted(endpoint.route.operation for endpoint in ENDPOINTS) == sorted(
        route.operation for route in INFERENCE_ROUTES
    )


def test_the_document_describes_every_endpoint_with_its_schemas_and_statuses() -> None:
    document = manifest("adder", "batchd.testing.batch_handlers:add_one")
    front = create_app(parse_manifest(document), ReplicaSettings())
    openapi = front.app.openapi()  # type: ignore[attr-defined]  # the FastAPI app behind the front
    schemas = openapi["components"]["schemas"]
    for endpoint in ENDPOINTS:
        operation = openapi["paths"][endpoint.route.path][endpoint.route.method.lower()]
        assert operation["operationId"] == endpoint.route.operation
        statuses = set(operation["responses"])
        names_model = endpoint.route.names_model or endpoint.route.model_field is not None
        expected = {"200", "400", "401", "403", "413", "422", "500", "503", "504"} | (
            {"404"} if names_model else set()
        )
        assert statuses == expected, endpoint.route
        assert "Retry-After" in operation["responses"]["503"]["headers"]
        if endpoint.request is not None:
            reference = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert reference.rpartition("/")[2] in schemas
        if endpoint.response is not None:
            answer = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
            assert answer.rpartition("/")[2] in schemas
    assert "seeds" not in str(openapi).lower()
