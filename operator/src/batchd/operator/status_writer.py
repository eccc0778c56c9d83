"""The one writer of a BatchedDeployment's status: each section written replaces the stored one
whole, so that nothing an older write put there survives (a key dropped from the spec leaves the
status too).

A write is a `BatchedDeploymentStatus` holding only the sections to write: the fields set on it
(`model_fields_set`), each the status' top-level field it names. The writer turns them into a JSON
Patch on the status subresource, one `add` per section that differs from what is stored (`add`
replaces a member that is there) and one `remove` per section set to None. A write computed from a
reading of the status (the replicas' batching count, a canary judgement) is guarded by a `test` of
the sections it read, so that the API server refuses it, whole, when another write moved one of
them meanwhile. The first write, which makes the status, is guarded by the resourceVersion read:
when a status was written since, the writer reads the resource again and writes over that one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from batchd.api.kube_connection import ApiError
from batchd.api.status import BatchedDeploymentStatus, dump_section
from batchd.operator.kube_requests import KubeApi

logger = logging.getLogger(__name__)

Operation = dict[str, Any]


def operations(
    stored: Mapping[str, Any], update: BatchedDeploymentStatus, guarded: Iterable[str] = (), version: str = ""
) -> list[Operation]:
    """The JSON Patch that makes each section set on `update` exactly its value (None: absent)
    over the `stored` status; no operation at all when it already is. `guarded`: sections whose
    stored value the update was computed from, tested first (sections that are there: JSON Patch
    cannot test for an absent one). `version`: the resourceVersion `stored` was read at, which the
    first write (the one that makes the status whole) tests, so as never to replace a status that
    another write made meanwhile."""
    wanted = {name: dump_section(getattr(update, name)) for name in sorted(update.model_fields_set)}
    changes: list[Operation] = []
    for name, value in wanted.items():
        if value is None:
            if name in stored:
                changes.append({"op": "remove", "path": f"/status/{name}"})
        elif stored.get(name) != value:
            changes.append({"op": "add", "path": f"/status/{name}", "value": value})
    if not changes:
        return []
    tests = [_test(name, stored[name]) for name in guarded]
    if not stored:  # no status yet: the first write makes it
        made = {name: value for name, value in wanted.items() if value is not None}
        unmoved = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}] if version else []
        return [*tests, *unmoved, {"op": "add", "path": "/status", "value": made}]
    return [*tests, *changes]


def _test(name: str, value: Any) -> Operation:
    return {"op": "test", "path": f"/status/{name}", "value": value}


# A first write that finds the status made meanwhile reads it again; each further miss means yet
# another writer got there first, which a lock-holding caller should never see twice.
FIRST_WRITE_ATTEMPTS = 3


class StatusWriter:
    """Writes status sections of one BatchedDeployment at a time (callers hold its lock)."""

    def __init__(self, api: KubeApi, path_of: Callable[[str, str], str]) -> None:
        self._api = api
        self._path_of = path_of  # (namespace, name) -> the resource's own path

    async def write(
        self,
        namespace: str,
        name: str,
        stored: Mapping[str, Any],
        version: str,
        update: BatchedDeploymentStatus,
        guarded: Iterable[str] = (),
    ) -> bool:
        """Write the sections set on `update` over the `stored` status (read at resourceVersion
        `version`); False when a guarded section had moved (nothing was written) or the resource is
        gone."""
        guarded = tuple(guarded)
        path = self._path_of(namespace, name)
        for _ in range(FIRST_WRITE_ATTEMPTS):
            patch = operations(stored, update, guarded, version)
            if not patch:
                return True
            try:
                await self._api.json_patch(f"{path}/status", patch)
                return True
            except ApiError as error:
                if error.status == 404:
                    return False
                if error.status != 422:
                    raise
                if guarded:
                    logger.debug("%s/%s: status moved since read, not written: %s", namespace, name, error)
                    return False
                if stored:
                    raise
            body = await self._api.get(path)  # the status was made since `stored` was read
            if body is None:
                return False
            stored, version = body.get("status") or {}, str(body["metadata"]["resourceVersion"])
        raise RuntimeError(f"{namespace}/{name}: the status kept moving under its first write")
