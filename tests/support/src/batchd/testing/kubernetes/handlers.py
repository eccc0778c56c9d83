"""The test batch handlers (`batchd.testing.batch_handlers`: slow, failing, counting) in replica pods,
shipped as a user ships handler code without rebuilding the image: a ConfigMap mounted into the
pod, on the PYTHONPATH (`batchd` is a namespace package, so `batchd.testing` joins the image's).
A tiny model built here reaches the pods the same way (`model_config_map`, `model_source`)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from batchd.testing import batch_handlers

CONFIG_MAP = "batchd-test-handlers"
MOUNT = "/opt/batchd-test-handlers"
MODEL_CONFIG_MAP = "batchd-test-model"
MODEL_MOUNT = "/opt/batchd-test-model"
# A ConfigMap holds at most 1 MiB: the tiny test models (tens of kilobytes) fit.
MAX_MODEL_BYTES = 900 * 1024


def config_map() -> dict[str, Any]:
    """The ConfigMap holding the handlers' module (apply it in the deployment's namespace)."""
    with open(batch_handlers.__file__) as source:
        code = source.read()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP},
        "data": {"package": "", "batch_handlers": code},
    }


def pod_spec() -> dict[str, Any]:
    """The BatchedDeployment spec fields that mount it where Python finds `batchd.testing`."""
    items = [
        {"key": "package", "path": "batchd/testing/__init__.py"},
        {"key": "batch_handlers", "path": "batchd/testing/batch_handlers.py"},
    ]
    return {
        "volumes": [{"name": "test-handlers", "configMap": {"name": CONFIG_MAP, "items": items}}],
        "volumeMounts": [{"name": "test-handlers", "mountPath": MOUNT, "readOnly": True}],
        "env": [{"name": "PYTHONPATH", "value": MOUNT}],
    }


def model_config_map(directory: Path) -> dict[str, Any]:
    """A ConfigMap holding the files of a model saved in `directory` (a tiny one built by
    `batchd.testing.models`), to apply in the deployment's namespace."""
    files = {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}
    size = sum(len(content) for content in files.values())
    assert size <= MAX_MODEL_BYTES, f"{directory} holds {size} bytes: too much for a ConfigMap"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": MODEL_CONFIG_MAP},
        "binaryData": {name: base64.b64encode(content).decode() for name, content in files.items()},
    }


def model_source() -> str:
    """Where a replica pod finds the model of `model_config_map` (`model.source`)."""
    return f"file://{MODEL_MOUNT}"


def pod_spec_with_model() -> dict[str, Any]:
    """`pod_spec()`, and the model's ConfigMap mounted where `model_source()` says."""
    spec = pod_spec()
    spec["volumes"].append({"name": "test-model", "configMap": {"name": MODEL_CONFIG_MAP}})
    spec["volumeMounts"].append({"name": "test-model", "mountPath": MODEL_MOUNT, "readOnly": True})
    return spec
