"""What the API server does to a custom resource before storing it, done here with real libraries.

The steps follow the apiextensions-apiserver: strict field validation (kubectl's default
`--validate=strict` refuses unknown fields), structural defaulting, OpenAPI v3 schema validation
(jsonschema, Draft 4: the dialect whose boolean `exclusiveMinimum` OpenAPI v3.0 uses), then the
CEL rules in `x-kubernetes-validations` evaluated with cel-python. Each problem comes back as
`path: message`, naming the field the way `kubectl apply` does.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from typing import Any

import celpy
import jsonschema
from celpy.adapter import json_to_cel

from batchd.api.crd import crd


@cache
def openapi_schema() -> dict[str, Any]:
    """The CRD's schema (`tests/api/test_crd.py` proves the committed file is the same)."""
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: a missing field with a `default` gets it, then its own defaults."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        if isinstance(value, list) and "items" in schema:
            return [apply_defaults(schema["items"], item) for item in value]
        return value
    result = dict(value)
    for name, child in schema.get("properties", {}).items():
        if name not in result and "default" in child:
            result[name] = copy.deepcopy(child["default"])
        if name in result:
            result[name] = apply_defaults(child, result[name])
    return result


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused wherever the CRD does not preserve them."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {name: _strict(child) for name, child in out["properties"].items()}
        if not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(out.get("items"), dict):
        out["items"] = _strict(out["items"])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(out["additionalProperties"])
    return out


def _path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(root)"


def schema_errors(schema: dict[str, Any], document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft4Validator(_strict(schema))
    problems = []
    for error in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path)):
        where = _path(error.absolute_path)
        if error.validator == "additionalProperties":
            problems.append(f"{where}: unknown field: {error.message}")
        else:
            problems.append(f"{where}: Invalid value: {error.instance!r}: {error.message}")
    return problems


@cache
def _program(rule: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))


def cel_errors(schema: dict[str, Any], value: Any, where: tuple[Any, ...] = ()) -> list[str]:
    """Evaluate every `x-kubernetes-validations` rule on the nodes present in `value`."""
    problems = []
    for rule in schema.get("x-kubernetes-validations", []):
        verdict = _program(rule["rule"]).evaluate({"self": json_to_cel(value)})
        if not (isinstance(verdict, celpy.celtypes.BoolType) and bool(verdict)):
            extra = rule["fieldPath"].strip(".").split(".") if "fieldPath" in rule else []
            field = _path((*where, *extra))
            problems.append(f"{field}: Invalid value: {rule['message']}")
    if isinstance(value, dict):
        for name, child in schema.get("properties", {}).items():
            if name in value:
                problems += cel_errors(child, value[name], (*where, name))
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            problems += cel_errors(schema["items"], item, (*where, index))
    return problems


# What the API server requires of every object's name (a DNS-1123 subdomain).
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def admit(document: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Default and validate one BatchedDeployment; returns (defaulted object, problems)."""
    name = str(document.get("metadata", {}).get("name", ""))
    if len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        return document, [
            f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain is required"
        ]
    schema = openapi_schema()
    defaulted = apply_defaults(schema, document)
    problems = schema_errors(schema, defaulted)
    if not problems:  # the API server runs CEL only on a schema-valid object
        problems = cel_errors(schema, defaulted)
    return defaulted, problems
