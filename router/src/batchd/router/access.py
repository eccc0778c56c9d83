"""Who a request's caller is, decided at the router, and the stamp that tells its replica.

Per request and deployment (`AccessPolicy`, from its spec): the credential the client presents
(`Authorization: Bearer` or `x-api-key`) is looked up by its digest among the deployment's API key
digests, or, where it is no known key and looks like a JWT, reviewed as a ServiceAccount token
(`token_reviews`); no credential is the tenant `anonymous` where the deployment allows it. An open
deployment (no spec.access) has one tenant, `anonymous`, for everyone, credentials ignored.

The router then strips every header whose meaning is its own (`CLIENT_IDENTITY_HEADERS`) and
stamps its decision, signed with the deployment's key (`batchd.api.stamp`). The keys and digests
come from the deployment's access Secret (`Keyring`, fed by a watch); a key never leaves this
module but as its digest, and no refusal's message or log line holds one.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from batchd.api.access import AccessPolicy, BadCredential, Tenant, decode_key_digests, key_digest
from batchd.api.access import presented as presented_credential
from batchd.api.headers import CALLED_BY_HEADER, FAIRNESS_HEADER, PRIORITY_HEADER
from batchd.api.pod import ACCESS_KEYS_KEY, ACCESS_SIGNING_KEY, INSTANCE_LABEL, access_secret_name
from batchd.api.stamp import Stamp, signed_headers
from batchd.router.directory import DeploymentRef
from batchd.router.errors import NotAllowed, NotReady, RouterError, Unauthorized

logger = logging.getLogger(__name__)

# The longest credential read (bytes): a projected token is about 1 KiB, an API key far less; a
# larger one is refused before it is hashed or sent to the API server.
REALM = b'Bearer realm="batchd"'
UNKNOWN_TENANT = "unknown"  # the metrics' tenant label of a caller that is no declared tenant


class Refused(RouterError):  # a base: its kinds below are what the error table maps
    """A request refused for who its caller is or what it asks; `reason` is the metrics' label
    (a fixed word), the message says why without the credential."""

    reason = "refused"

    def __init__(self, message: str, reason: str, tenant: str = UNKNOWN_TENANT) -> None:
        super().__init__(message)
        self.reason = reason
        self.tenant = tenant


class Unauthenticated(Refused, Unauthorized):
    """No credential where one is needed, or one that is no caller's (401 with WWW-Authenticate)."""

    headers = ((b"www-authenticate", REALM),)


class Forbidden(Refused, NotAllowed):
    """An authenticated caller that may not do what it asks (403)."""


class NoSigningKey(NotReady):
    """The deployment's access Secret (its signing key) is not read yet: its replicas would refuse
    what the router sends (503 with Retry-After)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the router holds of one deployment's access Secret: the key it signs stamps with, and
    the tenant of each API key, by the key's digest."""

    signing_key: bytes | None = None
    tenants_by_digest: Mapping[bytes, str] = field(default_factory=dict)


def credentials_of(secret: Mapping[str, Any]) -> Credentials:
    """A deployment's access Secret, read; a part that does not decode is left out, logged (the
    operator writes it, so this is a bug or a hand edit, never a key)."""
    data = secret.get("data") or {}
    name = (secret.get("metadata") or {}).get("name", "")
    signing_key: bytes | None = None
    digests: dict[bytes, str] = {}
    try:
        signing_key = base64.b64decode(data[ACCESS_SIGNING_KEY], validate=True) or None
    except KeyError:
        pass
    except (binascii.Error, ValueError, TypeError):
        logger.warning("access Secret %s: %s is not base64; no signing key", name, ACCESS_SIGNING_KEY)
    if ACCESS_KEYS_KEY in data:
        try:
            document = base64.b64decode(data[ACCESS_KEYS_KEY], validate=True)
            for tenant, found in decode_key_digests(document).items():
                digests.update(dict.fromkeys(found, tenant))
        except (binascii.Error, ValueError, TypeError) as error:
            logger.warning("access Secret %s: %s not read: %s", name, ACCESS_KEYS_KEY, error)
    return Credentials(signing_key, digests)


def secret_owner(secret: Mapping[str, Any]) -> DeploymentRef | None:
    """The deployment an access Secret belongs to: the one it is named for (`<name>-access`), and
    only where its instance label, if any, agrees. Labels alone never decide: whoever may write
    a Secret with the access labels (a tenant's own keys Secret, say) must not replace a
    deployment's signing key or key digests with one of another name."""
    metadata = secret.get("metadata") or {}
    namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
    suffix = access_secret_name("")
    owner = name.removesuffix(suffix) if name.endswith(suffix) else ""
    labelled = (metadata.get("labels") or {}).get(INSTANCE_LABEL)
    if not owner or not namespace or (labelled and labelled != owner):
        return None
    return DeploymentRef(namespace, owner)


class Keyring:
    """Every watched deployment's `Credentials`, as the Secret watch last saw them."""

    def __init__(self) -> None:
        self._found: dict[DeploymentRef, Credentials] = {}

    def get(self, ref: DeploymentRef) -> Credentials | None:
        return self._found.get(ref)

    def put_secret(self, secret: Mapping[str, Any]) -> None:
        owner = secret_owner(secret)
        if owner is not None:
            self._found[owner] = credentials_of(secret)

    def delete_secret(self, secret: Mapping[str, Any]) -> None:
        owner = secret_owner(secret)
        if owner is not None:
            self._found.pop(owner, None)

    def replace_secrets(self, secrets: Iterable[Mapping[str, Any]], namespace: str | None) -> None:
        self._found = {
            ref: found for ref, found in self._found.items() if namespace and ref.namespace != namespace
        }
        for secret in secrets:
            self.put_secret(secret)


# -- the caller ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from: its tenant, and the composing deployment it calls for ("")."""

    tenant: Tenant
    called_by: str = ""


def presented(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The credential a request presents (`batchd.api.access.presented`); None for none.
    Unauthenticated for a malformed one."""
    try:
        return presented_credential(headers)
    except BadCredential as error:
        raise Unauthenticated(str(error), error.reason) from None


def looks_like_token(credential: bytes) -> bool:
    """Whether a credential may be a ServiceAccount token (a JWT: three base64url parts)."""
    parts = credential.split(b".")
    return len(parts) == 3 and all(parts) and credential.startswith(b"ey")


class Reviews(Protocol):
    """ServiceAccount tokens reviewed (`token_reviews.TokenReviews`): the `namespace/name` of the
    account a token proves, where RBAC lets it invoke deployment `ref`; Refused otherwise."""

    async def account(self, token: bytes, ref: DeploymentRef) -> str: ...


def by_key(policy: AccessPolicy, credentials: Credentials | None, credential: bytes) -> Tenant | None:
    """The declared tenant whose API key `credential` is; None where it is no key of this deployment."""
    if credentials is None:
        return None
    name = credentials.tenants_by_digest.get(key_digest(credential))
    return policy.tenant(name) if name is not None else None


async def caller_of(
    policy: AccessPolicy,
    ref: DeploymentRef,
    headers: Iterable[tuple[bytes, bytes]],
    credentials: Credentials | None,
    reviews: Reviews | None,
    is_deployment: Any = None,
) -> Caller:
    """The caller of a request to `ref`; Unauthenticated (401) or Forbidden (403) naming why.
    `is_deployment(ref)`: whether a ServiceAccount's name is a deployment's (a composer's call)."""
    if policy.open:
        assert policy.anonymous is not None  # an open policy's one tenant
        # Its composers say who they are: believed, since everyone may use every class there and
        # a composed call only falls back to the default class where the callee lacks its own.
        return Caller(policy.anonymous, _composer_named(headers))
    credential = presented(headers)
    if credential is None:
        if policy.anonymous is None:
            raise Unauthenticated(
                f"deployment {ref}: a credential is needed (API key or token)", "no_credential"
            )
        return Caller(policy.anonymous)
    tenant = by_key(policy, credentials, credential)
    if tenant is not None:
        return Caller(tenant)
    if reviews is None or not looks_like_token(credential):
        raise Unauthenticated(f"deployment {ref}: the API key is none of its tenants'", "unknown_key")
    account = await reviews.account(credential, ref)
    name = policy.service_accounts.get(account)
    found = policy.tenant(name) if name is not None else None
    if found is None:
        raise Forbidden(f"deployment {ref}: service account {account} is none of its tenants", "no_tenant")
    namespace, _, account_name = account.partition("/")
    composer = DeploymentRef(namespace, account_name)
    called_by = account_name if is_deployment is not None and is_deployment(composer) else ""
    return Caller(found, called_by)


def _composer_named(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The composing deployment a request's `batchd-called-by` names ("" for none)."""
    for name, value in headers:
        if name.lower() == CALLED_BY_HEADER:
            return value.decode("latin-1")
    return ""


def stamped(key: bytes | None, method: str, target: str, stamp: Stamp) -> bytes:
    """The header lines that tell a replica what the router decided, signed with `key`. With no key
    (an open deployment whose Secret is not read yet) the class and the caller go unsigned and the
    tenant not at all: its replicas take an unstamped request as `anonymous`, and read its class."""
    if key is not None:
        headers = signed_headers(key, method, target, stamp)
    else:
        unsigned = ((PRIORITY_HEADER, stamp.priority), (FAIRNESS_HEADER, stamp.caller))
        headers = [(name, value.encode("latin-1")) for name, value in unsigned if value]
    return b"".join(b"%b: %b\r\n" % (name, value) for name, value in headers)
