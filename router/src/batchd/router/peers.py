"""How many routers serve now: the ready endpoints of the router's own Service, from its
EndpointSlices, so that each router enforces its share of a quota (`quotas`). One router where the
Service is not named (`router_service` empty: a router run by hand), or none of it is seen yet."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from batchd.api.pod import SERVICE_NAME_LABEL
from batchd.router.watching import Watched


class Peers:
    """The ready routers, by slice: `count()` is at least 1 (this router serves, or it would not
    be asked)."""

    def __init__(self) -> None:
        self._slices: dict[str, frozenset[str]] = {}

    def count(self) -> int:
        return max(1, len(frozenset().union(*self._slices.values())))

    def put(self, endpoint_slice: Mapping[str, Any]) -> None:
        name = str((endpoint_slice.get("metadata") or {}).get("name") or "")
        ready = set()
        for endpoint in endpoint_slice.get("endpoints") or []:
            addresses = endpoint.get("addresses") or []
            if addresses and (endpoint.get("conditions") or {}).get("ready") is not False:
                ready.add(str(addresses[0]))
        self._slices[name] = frozenset(ready)

    def delete(self, endpoint_slice: Mapping[str, Any]) -> None:
        self._slices.pop(str((endpoint_slice.get("metadata") or {}).get("name") or ""), None)

    def replace(self, slices: Iterable[Mapping[str, Any]], _namespace: str | None) -> None:
        self._slices = {}
        for endpoint_slice in slices:
            self.put(endpoint_slice)


def watched_peers(peers: Peers, service: str) -> Watched:
    """The watch of the router's own Service's slices (in the router's namespace)."""
    return Watched(
        "the routers' EndpointSlices",
        "discovery.k8s.io/v1",
        "endpointslices",
        f"{SERVICE_NAME_LABEL}={service}",
        peers.put,
        peers.delete,
        peers.replace,
    )
