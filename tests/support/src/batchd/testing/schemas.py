"""The Kubernetes versions batchd supports, and the built-in kinds' schemas of each
(kubernetes-validate), for checking a manifest without an API server."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

# The minor versions the README states, oldest first (`make test-kubernetes-range` runs the oldest
# and the newest on a real cluster).
KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36", "1.37")


def validate_builtin(document: dict[str, Any]) -> list[str]:
    """The real Kubernetes schemas, strict (unknown fields refused), for every supported version."""
    problems = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path) or "(root)"
            problems.append(f"{where}: {error.message} (Kubernetes {version})")
    return problems
