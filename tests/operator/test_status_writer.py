"""The status writer on a real API server: a first write made from a reading that holds no status
never replaces a status another write made since that reading."""

from __future__ import annotations

import functools

from batchd.api.kube_connection import resource_path
from batchd.api.spec import API_VERSION, PLURAL
from batchd.api.status import BatchedDeploymentStatus
from batchd.operator.kube_requests import KubeApi
from batchd.operator.status_writer import StatusWriter
from batchd.testing.kubernetes.operated import Namespace
from batchd.testing.manifests import manifest


async def test_a_first_write_from_a_stale_reading_keeps_what_was_written_since(ns: Namespace) -> None:
    ns.apply(manifest("first"))  # no operator runs here: nothing else writes its status
    reading = ns.bd("first")
    assert "status" not in reading
    version = reading["metadata"]["resourceVersion"]
    api = await KubeApi.connect(str(ns.cluster.admin_kubeconfig))
    try:
        writer = StatusWriter(api, functools.partial(resource_path, API_VERSION, PLURAL))
        assert await writer.write(ns.name, "first", {}, version, BatchedDeploymentStatus(desired_replicas=3))
        # A second writer read the resource before the first wrote: it too believes there is no status.
        assert await writer.write(ns.name, "first", {}, version, BatchedDeploymentStatus(url="http://first"))
    finally:
        await api.close()
    status = ns.bd("first")["status"]
    assert (status.get("desired_replicas"), status.get("url")) == (3, "http://first")
