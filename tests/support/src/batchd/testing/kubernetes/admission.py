"""What the real API server makes of a document, without storing it: `kubectl create --dry-run=server`
runs the whole admission (strict field validation, defaulting, the schema, CEL rules, the admission
plugins) and answers the object as it would be stored, or the refusal as `kubectl` prints it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

from batchd.testing.kubernetes.controlplane import ControlPlane


@dataclass(frozen=True)
class Admission:
    stored: dict[str, Any]  # the object as the API server would store it ({} when refused)
    refusal: str  # kubectl's message ('' when admitted)

    @property
    def admitted(self) -> bool:
        return not self.refusal


def admit(cluster: ControlPlane, namespace: str, document: dict[str, Any]) -> Admission:
    result = cluster.kubectl(
        "create",
        "--dry-run=server",
        "-o",
        "json",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump(document),
        check=False,
    )
    if result.returncode == 0:
        return Admission(json.loads(result.stdout), "")
    return Admission({}, result.stderr.strip())
