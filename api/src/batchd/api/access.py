"""Who may call a deployment and what each caller may do, read one way by the router and the replicas.

A deployment's `spec.access` declares its tenants: each known by its credentials (API keys kept in
Secrets, ServiceAccounts), each with its entitlements (the priority classes it may ask for and
its default one, its share of a replica's queue, its quotas, whether its trace decisions are
followed). The router decides who a request's caller is and grants it a class; a replica only
believes what the router signed (`stamp`). Both read the same `AccessPolicy`, made from the spec,
so that a router and a replica never disagree on what a tenant may do.

A deployment without `spec.access` is open: every caller is the one tenant `anonymous`, which may
use every class and has the whole queue; they share one prefix cache, since nothing tells them
apart.

API keys reach the router as digests only (`key_digest`), in the Secret the operator keeps per
deployment (`ACCESS_KEYS_KEY`); the keys themselves stay in the users' Secrets.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from batchd.api.headers import API_KEY_HEADER, AUTHORIZATION_HEADER
from batchd.api.priority import PriorityClass, PriorityClasses, UnknownPriorityClass
from batchd.api.spec import ANONYMOUS_TENANT, BatchedDeploymentSpec, Entitlements

__all__ = [
    "ANONYMOUS_TENANT",
    "AccessPolicy",
    "NotEntitled",
    "Tenant",
    "decode_key_digests",
    "encode_key_digests",
    "granted_class",
    "key_digest",
]


class NotEntitled(PermissionError):
    """The caller's tenant may not do what the request asks (a 403); the message names what was
    asked and what the tenant may use, never what other tenants may."""


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant's entitlements at one deployment, with the defaults filled in."""

    name: str
    classes: frozenset[str] | None  # the classes it may ask for; None: every class (an open deployment)
    default_class: str  # its requests' class where they name none
    queue_items: int  # the most items it may have waiting in one replica's queue
    requests_per_s: float | None = None  # None: no quota
    tokens_per_minute: int | None = None
    trust_traces: bool = False  # whether its callers' sampled flag records their requests

    def may_use(self, priority_class: str) -> bool:
        return self.classes is None or priority_class in self.classes


@dataclass(frozen=True)
class AccessPolicy:
    """A deployment's tenants, as the router authenticates and grants them and a replica queues
    them. `open`: no spec.access, every caller is `anonymous`."""

    open: bool
    tenants: Mapping[str, Tenant]  # by name, `anonymous` among them where it may call
    service_accounts: Mapping[str, str] = field(default_factory=dict)  # `namespace/name` -> tenant
    key_secrets: Mapping[str, str] = field(default_factory=dict)  # tenant -> its API keys' Secret

    @classmethod
    def of(cls, spec: BatchedDeploymentSpec) -> AccessPolicy:
        batching = spec.batching
        bound = batching.max_queued_requests
        if spec.access is None:
            # Open: every caller is one tenant, so a class or a sampled flag a caller names takes
            # nothing from another tenant; every class is theirs, and their flags are trusted.
            default = batching.default_priority_class
            everyone = Tenant(ANONYMOUS_TENANT, None, default, bound, trust_traces=True)
            return cls(open=True, tenants={ANONYMOUS_TENANT: everyone})
        access = spec.access
        declared: list[tuple[str, Entitlements]] = [(tenant.name, tenant) for tenant in access.tenants]
        if access.anonymous is not None:
            declared.append((ANONYMOUS_TENANT, access.anonymous))
        equal_share = 1 / len(declared)
        tenants = {
            name: _tenant(name, entitled, batching.default_priority_class, bound, equal_share)
            for name, entitled in declared
        }
        return cls(
            open=False,
            tenants=tenants,
            service_accounts={
                account: tenant.name for tenant in access.tenants for account in tenant.service_accounts
            },
            key_secrets={
                tenant.name: tenant.api_keys_secret for tenant in access.tenants if tenant.api_keys_secret
            },
        )

    @property
    def anonymous(self) -> Tenant | None:
        """The tenant of callers without a credential; None where they are refused."""
        return self.tenants.get(ANONYMOUS_TENANT)

    def tenant(self, name: str) -> Tenant | None:
        return self.tenants.get(name)


def _tenant(
    name: str, entitled: Entitlements, deployment_default: str, bound: int, equal_share: float
) -> Tenant:
    classes = frozenset(entitled.priority_classes) if entitled.priority_classes is not None else None
    if classes is None:
        classes = frozenset({deployment_default})
    default = entitled.default_priority_class
    if default is None:
        default = deployment_default if deployment_default in classes else entitled.priority_classes[0]  # type: ignore[index]
    share = entitled.queue_share if entitled.queue_share is not None else equal_share
    return Tenant(
        name=name,
        classes=classes,
        default_class=default,
        queue_items=max(1, math.floor(bound * share)),
        requests_per_s=entitled.requests_per_s,
        tokens_per_minute=entitled.tokens_per_minute,
        trust_traces=entitled.trust_traces,
    )


def granted_class(
    tenant: Tenant, classes: PriorityClasses, asked: str | None, *, composed: bool = False
) -> PriorityClass:
    """The class `tenant` gets for a request that asks for `asked` (None: it named none) at a
    deployment with `classes`. NotEntitled (403) naming the class and the tenant's classes when it
    may not use it; UnknownPriorityClass (400) for a class the deployment lacks, naming the classes
    this tenant may use (every class only where it may use every class). A composer's call
    (`composed`) that names a class the callee lacks is in the tenant's default class."""
    default = classes.get(tenant.default_class) or classes.default
    if asked is None:
        return default
    name = asked.strip().lower()
    found = classes.get(name)
    if found is None:
        if composed:
            return default
        raise UnknownPriorityClass(
            f"priority class: expected one of {', '.join(_usable(tenant, classes))}, got {asked!r}"
        )
    if not tenant.may_use(found.name):
        raise NotEntitled(
            f"priority class {found.name!r}: tenant {tenant.name!r} may use "
            f"{', '.join(_usable(tenant, classes))}"
        )
    return found


def _usable(tenant: Tenant, classes: PriorityClasses) -> list[str]:
    return [name for name in classes.names if tenant.may_use(name)]


# -- API keys, as digests ---------------------------------------------------------------------------


def key_digest(key: str | bytes) -> bytes:
    """What is kept of an API key: its SHA-256. Keys are long random strings, so a digest without a
    salt or a slow hash is enough, and a request's key is looked up by its digest in O(1)."""
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(raw).digest()


def encode_key_digests(digests: Mapping[str, list[bytes]]) -> bytes:
    """tenant -> digests of its keys, as the operator writes them into the access Secret."""
    document = {tenant: sorted(d.hex() for d in found) for tenant, found in sorted(digests.items())}
    return json.dumps(document, separators=(",", ":")).encode()


def decode_key_digests(document: bytes) -> dict[str, frozenset[bytes]]:
    """The inverse of `encode_key_digests`; ValueError naming what is wrong."""
    try:
        parsed = json.loads(document)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"API key digests: not JSON ({error})") from None
    if not isinstance(parsed, dict):
        raise ValueError("API key digests: expected an object of tenant: [digest, ...]")
    found: dict[str, frozenset[bytes]] = {}
    for tenant, digests in parsed.items():
        if not isinstance(digests, list) or not all(isinstance(d, str) for d in digests):
            raise ValueError(f"API key digests of tenant {tenant!r}: expected a list of hex strings")
        found[tenant] = frozenset(bytes.fromhex(d) for d in digests)
    return found


# -- credentials -----------------------------------------------------------------------------------

# The longest credential read: a ServiceAccount token is about 1 KB, an API key far less.
MAX_CREDENTIAL_BYTES = 16 * 1024


class BadCredential(ValueError):
    """A credential that is malformed, never guessed at (a 401); `reason` is its label in metrics.
    The message never holds the credential."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def presented(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The credential a request presents (`Authorization: Bearer`, else `x-api-key`); None for none.
    BadCredential for a malformed one."""
    bearer = api_key = None
    for name, value in headers:
        lowered = name.lower()
        if lowered == AUTHORIZATION_HEADER:
            bearer = value
        elif lowered == API_KEY_HEADER:
            api_key = value
    if bearer is not None:
        scheme, _, credential = bearer.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            raise BadCredential("Authorization: expected the scheme Bearer", "bad_scheme")
        found = credential.strip()
    elif api_key is not None:
        found = api_key.strip()
    else:
        return None
    if not found:
        raise BadCredential("the credential is empty", "empty_credential")
    if len(found) > MAX_CREDENTIAL_BYTES:
        raise BadCredential(f"the credential is longer than {MAX_CREDENTIAL_BYTES} bytes", "too_long")
    return found


def key_digests_of(user_secret: Mapping[str, Any]) -> frozenset[bytes]:
    """The digests of every API key in a user's Secret: each data value is one key (base64, as the
    API server answers; `stringData` as written, for a Secret read from a file). Whitespace around
    a key (a file's final newline) is not part of it, since no header can carry it; an empty value
    is no key (an empty credential must never match)."""
    found = set()
    for item in (user_secret.get("data") or {}).values():
        try:
            key = base64.b64decode(item, validate=True).strip() if isinstance(item, str) else b""
        except (binascii.Error, ValueError):
            continue
        if key:
            found.add(key_digest(key))
    for item in (user_secret.get("stringData") or {}).values():
        key = item.strip().encode() if isinstance(item, str) else b""
        if key:
            found.add(key_digest(key))
    return frozenset(found)


def read_key_secrets(path: Path) -> dict[bytes, str]:
    """API keys from a file of the Secrets a deployment's tenants name (`api_keys_secret`), as they
    would be applied to a cluster (YAML, one document each, `data` or `stringData`), for a replica
    that takes keys itself: each key's digest -> the name of the Secret it is in. ValueError naming
    the file and what is wrong; never a key."""
    try:
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not YAML ({type(error).__name__})") from None
    found: dict[bytes, str] = {}
    for n, document in enumerate(documents):
        metadata = document.get("metadata") if isinstance(document, dict) else None
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if not isinstance(document, dict) or document.get("kind") != "Secret" or not isinstance(name, str):
            raise ValueError(f"{path}: document {n}: expected a Secret with a metadata.name")
        digests = key_digests_of(document)
        if not digests:
            raise ValueError(f"{path}: Secret {name!r} holds no API key")
        found.update(dict.fromkeys(digests, name))
    return found
