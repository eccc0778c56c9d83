"""What is read off a Pod, the same way everywhere (the tests on the real cluster, the stand-in
cluster's controllers), as Kubernetes reads it."""

from __future__ import annotations

from typing import Any

Manifest = dict[str, Any]


def is_ready(pod: Manifest) -> bool:
    """The Pod's `Ready` condition, as the endpoints and Deployment controllers read it."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(item.get("type") == "Ready" and item.get("status") == "True" for item in conditions)


def is_terminating(pod: Manifest) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def is_finished(pod: Manifest) -> bool:
    """Its containers are done for good (restartPolicy): it serves nobody and counts for nobody."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
