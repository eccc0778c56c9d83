"""Reading a BatchedDeployment manifest from YAML, with errors that name the field and the value."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from batchd.api.spec import API_VERSION, KIND, RAY_SERVE_NAMES, BatchedDeployment, BatchedDeploymentSpec

ModelT = TypeVar("ModelT", bound=BaseModel)


class ManifestError(ValueError):
    """A manifest that cannot be served; the message names each bad field and its value."""


def document(name: str, spec: Mapping[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
    """A BatchedDeployment manifest, as `kubectl apply` takes it and `batchd serve` reads it."""
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": dict(spec)}


def parse_manifest(document: Any, *, origin: str = "manifest") -> BatchedDeployment:
    """Validate one already-parsed manifest (a dict from YAML or from the API server)."""
    if not isinstance(document, dict):
        raise ManifestError(
            f"{origin}: expected a mapping with apiVersion, kind, metadata and spec, "
            f"got {type(document).__name__}"
        )
    try:
        return BatchedDeployment.model_validate(document)
    except ValidationError as error:
        raise ManifestError(f"{origin}: invalid {KIND}:\n{describe_errors(error)}") from None


def load_manifest(path: str | Path) -> BatchedDeployment:
    """Read the first BatchedDeployment in a YAML file (other kinds in the same file are skipped)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ManifestError(f"{path}: cannot read: {error.strerror}") from None
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        raise ManifestError(f"{path}: not valid YAML: {error}") from None
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == KIND:
            return parse_manifest(document, origin=str(path))
    raise ManifestError(f"{path}: no document with kind: {KIND} among {len(documents)} document(s)")


def describe_errors(error: ValidationError) -> str:
    """One line per problem: `spec.batching.max_batch_size: Input should be ... (got -1)`."""
    lines = []
    for problem in error.errors(include_url=False):
        field = ".".join(str(part) for part in problem["loc"]) or "(root)"
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden" and len(problem["loc"]) >= 2:
            # A name from Ray Serve's batching_config: say which of ours to use.
            message = RAY_SERVE_NAMES.get((str(problem["loc"][-2]), str(problem["loc"][-1])), message)
        got = "" if problem["type"] in ("missing", "value_error") else f" (got {problem['input']!r})"
        lines.append(f"  {field}: {message}{got}")
    return "\n".join(lines)


def lenient_spec(raw: Any) -> BatchedDeploymentSpec:
    """A spec as this version can read it, for a process that must go on serving whatever the
    spec says (the router): fields it does not know (a newer CRD's) are dropped, and a section
    that still does not validate (a rule the operator reports as Degraded) keeps those of its
    fields that do, the defaults for the rest."""
    return _lenient(BatchedDeploymentSpec, raw if isinstance(raw, Mapping) else {})


def _lenient(model: type[ModelT], raw: Mapping[str, Any]) -> ModelT:
    known = _known(model, raw)
    try:
        return model.model_validate(known)
    except ValidationError:
        pass
    kept: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        if key not in known:
            continue
        annotation = _model_in(info.annotation)
        try:
            if annotation is not None and isinstance(known[key], Mapping):
                kept[name] = _lenient(annotation, known[key])
            else:
                kept[name] = _field_adapter(info).validate_python(known[key])
        except ValidationError:
            continue  # its default
    return model.model_construct(**kept)


def _field_adapter(info: FieldInfo) -> TypeAdapter[Any]:
    """One field's type with its constraints (bounds, patterns), to validate it alone."""
    annotation: Any = info.annotation
    if info.metadata:
        annotation = typing.Annotated[annotation, *info.metadata]
    return TypeAdapter(annotation)


def _known(model: type[BaseModel], raw: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` with only the fields `model` declares, at every depth it declares models."""
    known: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        if key not in raw:
            continue
        value, inner = raw[key], _model_in(info.annotation)
        if inner is not None and isinstance(value, Mapping):
            value = _known(inner, value)
        elif inner is not None and isinstance(value, list):
            value = [_known(inner, item) if isinstance(item, Mapping) else item for item in value]
        known[key] = value
    return known


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds (`X`, `X | None`, `list[X]`, `tuple[X, ...]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, tuple, typing.Annotated):
        for argument in typing.get_args(annotation):
            found = _model_in(argument)
            if found is not None:
                return found
    return None
