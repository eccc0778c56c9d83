"""A deployment's access Secret: the key the router signs its stamps with, and the digests of the
tenants' API keys, as pure functions from the spec and the Secrets read.

The operator keeps one Secret per deployment (`access_secret_name`), open ones too, so that a
replica always has a key to check stamps with. The signing key is made once and read back before
every apply: an edit never rotates it (the replicas read it once, at start-up). The API keys
themselves stay in the users' Secrets; only their digests (`key_digest`) are copied, and a user
Secret that is missing keeps its tenant's last digests, so that a mistyped name or a Secret being
recreated does not lock every caller out.

Nothing here logs, and nothing returned but the manifest holds a secret's value: conditions and
events name Secrets, never what is in them.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from batchd.api.access import AccessPolicy, decode_key_digests, encode_key_digests, key_digests_of
from batchd.api.pod import (
    ACCESS_COMPONENT,
    ACCESS_KEYS_KEY,
    ACCESS_SIGNING_KEY,
    INSTANCE_LABEL,
    MANAGED_BY,
    access_secret_name,
)
from batchd.api.status import Condition
from batchd.operator.status import condition

Manifest = dict[str, Any]
# HMAC-SHA256's own block of entropy: a longer key adds nothing, a shorter one weakens it.
SIGNING_KEY_BYTES = 32
# Where a deployment has no spec.access.
OPEN_MESSAGE = (
    "open (no spec.access): every caller is the one tenant 'anonymous', with every class, and all "
    "callers share one prefix cache"
)


@dataclass(frozen=True)
class AccessState:
    """What the access Secret holds after this converge, and the user Secrets that were missing."""

    signing_key: bytes = field(repr=False)
    digests: Mapping[str, frozenset[bytes]] = field(repr=False)  # tenant -> its keys' digests
    missing: tuple[tuple[str, str], ...] = ()  # (tenant, Secret) whose Secret was not found


def _data(secret: Mapping[str, Any] | None, key: str) -> bytes | None:
    """One item of a Secret as the API server answers it (base64), decoded; None if absent or bad."""
    value = ((secret or {}).get("data") or {}).get(key)
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def kept_signing_key(existing: Mapping[str, Any] | None) -> bytes | None:
    """The signing key of the access Secret as it is now; None where there is none to keep."""
    key = _data(existing, ACCESS_SIGNING_KEY)
    return key if key is not None and len(key) == SIGNING_KEY_BYTES else None


def kept_digests(existing: Mapping[str, Any] | None) -> dict[str, frozenset[bytes]]:
    """The digests the access Secret holds now ({} where it has none or they do not parse)."""
    document = _data(existing, ACCESS_KEYS_KEY)
    if document is None:
        return {}
    try:
        return decode_key_digests(document)
    except ValueError:
        return {}


def access_state(
    policy: AccessPolicy,
    existing: Mapping[str, Any] | None,
    user_secrets: Mapping[str, Mapping[str, Any] | None],
    new_key: Callable[[], bytes] = lambda: secrets.token_bytes(SIGNING_KEY_BYTES),
) -> AccessState:
    """The access Secret's contents for `policy`, given the access Secret as it is (`existing`)
    and each user Secret the policy names, by name (None: not found). The signing key is kept;
    a missing user Secret keeps its tenant's last digests."""
    last = kept_digests(existing)
    digests: dict[str, frozenset[bytes]] = {}
    missing = []
    for tenant, secret_name in sorted(policy.key_secrets.items()):
        found = user_secrets.get(secret_name)
        if found is None:
            missing.append((tenant, secret_name))
            digests[tenant] = last.get(tenant, frozenset())
        else:
            digests[tenant] = key_digests_of(found)
    return AccessState(kept_signing_key(existing) or new_key(), digests, tuple(missing))


def secret_labels(name: str) -> dict[str, str]:
    """The access Secret's labels: the router's watch selects them (ACCESS_SECRET_SELECTOR)."""
    return {**ACCESS_COMPONENT, **MANAGED_BY, INSTANCE_LABEL: name}


def access_secret(name: str, state: AccessState) -> Manifest:
    digests = encode_key_digests({tenant: list(found) for tenant, found in state.digests.items()})
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": access_secret_name(name), "labels": secret_labels(name)},
        "type": "Opaque",
        "data": {
            ACCESS_SIGNING_KEY: base64.b64encode(state.signing_key).decode(),
            ACCESS_KEYS_KEY: base64.b64encode(digests).decode(),
        },
    }


def access_condition(policy: AccessPolicy, state: AccessState, generation: int) -> Condition:
    """AccessReady: False naming each missing Secret (its tenant keeps its last keys), else True
    saying who may call (an open deployment's callers are one tenant sharing one cache)."""
    if state.missing:
        named = ", ".join(f"{secret!r} (tenant {tenant!r})" for tenant, secret in state.missing)
        message = (
            f"API keys Secret {named} not found in the deployment's namespace; "
            "the keys last read from it are still accepted"
        )
        return condition("AccessReady", False, "SecretMissing", message, generation)
    if policy.open:
        return condition("AccessReady", True, "Open", OPEN_MESSAGE, generation)
    keys = sum(len(found) for found in state.digests.values())
    tenants = len(policy.tenants) - (1 if policy.anonymous else 0)
    anonymous = "tenant 'anonymous'" if policy.anonymous else "refused"
    message = f"{tenants} tenant(s), {keys} API key(s); callers without a credential: {anonymous}"
    return condition("AccessReady", True, "Authenticated", message, generation)


def user_secrets_named(policy: AccessPolicy) -> frozenset[str]:
    """The user Secrets this deployment's access reads (the operator follows their changes)."""
    return frozenset(policy.key_secrets.values())
