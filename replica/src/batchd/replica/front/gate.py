"""Who a request's caller is, as a replica believes it: what batchd's router signed, or nobody.

The router authenticates callers, grants each a class, and stamps what it decided in headers it
signs with the deployment's key (`batchd.api.stamp`). A replica believes those headers only with
a valid, fresh, unused stamp, so it does not depend on the network to tell a router's request
from anyone else's. Every request asks here, through the one pipeline (`pipeline`), so there is
one way in.

- A deployment with `spec.access` serves only stamped requests: anything else is a 401
  (Unauthenticated), whatever headers it sends.
- An open deployment (no `spec.access`) serves unstamped requests too, as the one tenant
  `anonymous`, with the class and the fairness id its headers name: every caller may use every
  class there, so nothing is granted that was not already.
- A replica that takes API keys itself (`batchd serve --api-keys`, on one machine with no router)
  serves an unstamped request of a deployment with `spec.access` as the tenant whose key it
  presents, in a class that tenant may use (403 otherwise), as the router would; no quotas.
- Stamped headers that do not check (forged, stale, replayed, or unverifiable without a key)
  are a 401 at either: a request that claims the router's word and lacks it is refused, never
  served as something else.

Health, readiness, metadata and `/load` do not come here: they are the kubelet's, the
operator's and the router's, and carry no caller.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from batchd.api import priority
from batchd.api.access import (
    ANONYMOUS_TENANT,
    AccessPolicy,
    BadCredential,
    Tenant,
    granted_class,
    key_digest,
    presented,
)
from batchd.api.priority import PriorityClasses, named_in_headers
from batchd.api.spec import BatchedDeployment
from batchd.api.stamp import BadStamp, ReplayGuard, WrongKey, stamp_present, verified
from batchd.replica import errors
from batchd.replica.errors import Unauthenticated

# How often, at most, the signing key is read again for a stamp of another key.
KEY_REREAD_S = 1.0
# A replica's own API keys (`batchd serve --api-keys`): each key's digest -> the Secret it is in.
LocalKeys = Mapping[bytes, str]


@dataclass(frozen=True, slots=True)
class Caller:
    """What a request may claim: its tenant (whose cached prefixes and queue share it uses), the
    class it asks for and the caller within the tenant (None: not said), and whether a composer
    calls."""

    tenant: str
    priority: bytes | None
    caller: bytes | None
    composed: bool
    queue_items: int | None = None  # its tenant's share of a replica's queue; None: the whole queue


ANONYMOUS = Caller(ANONYMOUS_TENANT, None, None, False)  # an open deployment's caller that said nothing


@dataclass(frozen=True, slots=True)
class _Reading:
    """What the gate reads off one manifest, once: its access policy, its classes, and the tenant
    of each of the replica's own API keys (by digest) under that policy."""

    manifest: BatchedDeployment
    policy: AccessPolicy
    classes: PriorityClasses
    tenants_by_key: Mapping[bytes, Tenant]

    @classmethod
    def of(cls, manifest: BatchedDeployment, keys: LocalKeys | None) -> _Reading:
        policy = AccessPolicy.of(manifest.spec)
        owners = {secret: policy.tenants[tenant] for tenant, secret in policy.key_secrets.items()}
        tenants = {digest: owners[secret] for digest, secret in (keys or {}).items() if secret in owners}
        return cls(manifest, policy, PriorityClasses.of(manifest.spec.batching), tenants)


class Gate:
    """The check every inference request passes, for one deployment: `caller` says who it is.
    The access policy is the one of the manifest the replica serves now (`manifest()`), so a live
    edit of spec.access applies from the next request."""

    def __init__(
        self,
        manifest: Callable[[], BatchedDeployment],
        key: bytes | None,
        local_keys: LocalKeys | None = None,
        key_file: Path | None = None,
    ) -> None:
        self._manifest = manifest
        self._key = key
        self._key_file = key_file  # read again when a stamp is another key's (below)
        self._key_read_at = time.monotonic()
        self._local_keys = local_keys
        self._guard = ReplayGuard()
        self._reading: _Reading | None = None

    @classmethod
    def reading(
        cls,
        manifest: Callable[[], BatchedDeployment],
        key_file: Path | None,
        local_keys: LocalKeys | None = None,
    ) -> Gate:
        """A gate with the signing key at `key_file`, or none; and the replica's own API keys, if
        it takes any."""
        return cls(manifest, None if key_file is None else key_file.read_bytes(), local_keys, key_file)

    def _key_changed(self) -> bool:
        """Whether the mounted key is another now: the operator made a new one (its access Secret
        was deleted or broken) and the kubelet has updated the file, which the router's watch saw
        first. Read at most once a second, however many forged stamps arrive."""
        now = time.monotonic()
        if self._key_file is None or now - self._key_read_at < KEY_REREAD_S:
            return False
        self._key_read_at = now
        try:
            key = self._key_file.read_bytes()
        except OSError:
            return False
        if not key or key == self._key:
            return False
        self._key = key
        return True

    def _read(self) -> _Reading:
        manifest = self._manifest()
        if self._reading is None or self._reading.manifest is not manifest:
            self._reading = _Reading.of(manifest, self._local_keys)
        return self._reading

    def caller(self, method: str, target: str, headers: Iterable[tuple[bytes, bytes]]) -> Caller:
        """Who sends `method target` with `headers`; Unauthenticated (401) saying why when the
        replica may not believe it, or may not serve it unstamped."""
        headers = list(headers)
        reading = self._read()
        policy = reading.policy
        if stamp_present(headers):
            if self._key is None:
                raise Unauthenticated(
                    "the request is stamped, and this replica has no signing key to check it with"
                )
            try:
                stamp = verified(self._key, method, target, headers, self._guard)
            except WrongKey as error:
                if not self._key_changed():
                    raise Unauthenticated(str(error)) from None
                try:  # signed with the key the router has read since
                    stamp = verified(self._key, method, target, headers, self._guard)
                except BadStamp as again:
                    raise Unauthenticated(str(again)) from None
            except BadStamp as error:
                raise Unauthenticated(str(error)) from None
            tenant = stamp.tenant or ANONYMOUS_TENANT
            entitled = policy.tenant(tenant)
            return Caller(
                tenant,
                stamp.priority.encode("latin-1") or None,
                stamp.caller.encode("latin-1") or None,
                bool(stamp.called_by),
                None if entitled is None or policy.open else entitled.queue_items,
            )
        if not policy.open:
            if self._local_keys is not None:
                return self._local_caller(headers, reading)
            raise Unauthenticated(
                f"deployment {reading.manifest.metadata.name!r} takes requests only through batchd's router"
            )
        asked, caller, composed = named_in_headers(headers)
        return Caller(ANONYMOUS_TENANT, asked, caller, composed)

    @staticmethod
    def _local_caller(headers: list[tuple[bytes, bytes]], reading: _Reading) -> Caller:
        """The caller an unstamped request presents itself as to a replica that takes API keys:
        the tenant of its key (or `anonymous`, where allowed), in the class it asks for if that
        tenant may use it. A composer's mark is not believed: nobody signed it."""
        tenant = Gate._tenant_of(headers, reading)
        asked, caller, _ = named_in_headers(headers)
        try:
            named = None if asked is None else asked.decode("latin-1")
            granted = granted_class(tenant, reading.classes, named)
        except priority.UnknownPriorityClass as error:
            raise errors.UnknownPriorityClass(str(error)) from None
        return Caller(tenant.name, granted.name.encode("latin-1"), caller, False, tenant.queue_items)

    @staticmethod
    def _tenant_of(headers: list[tuple[bytes, bytes]], reading: _Reading) -> Tenant:
        name, policy = reading.manifest.metadata.name, reading.policy
        try:
            credential = presented(headers)
        except BadCredential as error:
            raise Unauthenticated(str(error)) from None
        if credential is None:
            if policy.anonymous is None:
                raise Unauthenticated(f"deployment {name!r}: a credential is needed (an API key)")
            return policy.anonymous
        found = reading.tenants_by_key.get(key_digest(credential))
        if found is None:
            raise Unauthenticated(f"deployment {name!r}: the API key is none of its tenants'")
        return found
