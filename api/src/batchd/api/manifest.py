"""Reading a BatchedDeployment manifest from YAML, with errors that name the field and the value."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from batchd.api.spec import API_VERSION, KIND, RAY_SERVE_NAMES, BatchedDeployment


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
