"""The test batch handlers (`batchd.testing.batch_handlers`: slow, failing, counting) in replica pods,
shipped as a user ships handler code without rebuilding the image: a ConfigMap mounted into the
pod, on the PYTHONPATH (`batchd` is a namespace package, so `batchd.testing` joins the image's)."""

from __future__ import annotations

from typing import Any

from batchd.testing import batch_handlers

CONFIG_MAP = "batchd-test-handlers"
MOUNT = "/opt/batchd-test-handlers"


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
