"""The replica's OpenAPI document: FastAPI's routes as FastAPI describes them, and the endpoints
(answered in front of FastAPI) from the same table the front answers them by.

A route's error statuses come from the error table (`errors.ENDPOINT_STATUSES`), its schemas
from the pydantic models its endpoint names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from batchd.replica.errors import ErrorBody, endpoint_statuses, openapi_responses
from batchd.replica.front.endpoints import Endpoint

_REF = "#/components/schemas/{model}"
_NAME_PARAMETER = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"title": "Name", "type": "string"},
}


def document(app: FastAPI, endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    """The whole document, made once and kept on the app."""
    if app.openapi_schema is None:
        app.openapi_schema = _made(app, endpoints)
    return app.openapi_schema


def _made(app: FastAPI, endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    document = get_openapi(title=app.title, version=app.version, routes=app.routes)
    # batchd answers a malformed request with 400 (declared per route), never FastAPI's 422.
    for path in document.get("paths", {}).values():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [(ErrorBody, "serialization")]
    for endpoint in endpoints:
        if endpoint.error_schema is not ErrorBody:
            models.append((endpoint.error_schema, "serialization"))
        if endpoint.request is not None:
            models.append((endpoint.request, "validation"))
        if endpoint.response is not None:
            models.append((endpoint.response, "serialization"))
    refs, definitions = models_json_schema(models, ref_template=_REF)
    schemas.update(definitions.get("$defs", {}))
    paths = document.setdefault("paths", {})
    for endpoint in endpoints:
        operation = _operation(endpoint, refs)
        paths.setdefault(endpoint.route.path, {})[endpoint.route.method.lower()] = operation
    document["paths"] = dict(sorted(paths.items()))
    return document


def _operation(endpoint: Endpoint, refs: dict[tuple[Any, Any], dict[str, Any]]) -> dict[str, Any]:
    route = endpoint.route
    operation: dict[str, Any] = {
        "tags": [endpoint.tag],
        "summary": endpoint.summary,
        "operationId": route.operation,
    }
    if endpoint.description:
        operation["description"] = endpoint.description
    parameters = [_NAME_PARAMETER] if route.names_model else []
    parameters += endpoint.parameters
    if parameters:
        operation["parameters"] = parameters
    if endpoint.request is not None:
        schema = refs[(endpoint.request, "validation")]
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    if endpoint.streaming is not None:
        content = {endpoint.streaming.media_type: {"schema": {"type": "string"}}}
        success = {"description": endpoint.streaming.description, "content": content}
    else:
        schema = {} if endpoint.response is None else refs[(endpoint.response, "serialization")]
        content = {"application/json": {"schema": schema}}
        description = endpoint.response_description
        if endpoint.streamed_description is not None:
            content["text/event-stream"] = {"schema": {"type": "string"}}
            description += " " + endpoint.streamed_description
        success = {"description": description, "content": content}
    # A model named in the body may be one this replica does not serve (404), as one in the path.
    names_model = route.names_model or route.model_field is not None
    errors = openapi_responses(*endpoint_statuses(names_model=names_model), schema=endpoint.error_schema)
    operation["responses"] = {"200": success} | {
        str(status): _plain(answer) for status, answer in errors.items()
    }
    return operation


def _plain(response: dict[str, Any]) -> dict[str, Any]:
    """A FastAPI-style `responses` entry (`model`: its schema) as OpenAPI writes it."""
    plain = {key: value for key, value in response.items() if key != "model"}
    plain["content"] = {
        "application/json": {"schema": {"$ref": _REF.format(model=response["model"].__name__)}}
    }
    return plain
