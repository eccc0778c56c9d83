"""A deployment's access Secret: its signing key made once and kept, the digests of the tenants' API
keys following their Secrets, a missing Secret reported and its last digests kept (pure functions;
`test_access_cluster.py` converges the same on a real API server)."""

from __future__ import annotations

import base64
from typing import Any

from batchd.api.access import AccessPolicy, decode_key_digests, key_digest
from batchd.api.manifest import parse_manifest
from batchd.api.pod import (
    ACCESS_KEYS_KEY,
    ACCESS_SECRET_SELECTOR,
    ACCESS_SIGNING_KEY,
    access_secret_name,
)
from batchd.api.spec import BatchedDeployment
from batchd.operator import access
from batchd.testing.manifests import manifest

ACCESS = {
    "tenants": [
        {"name": "search", "api_keys_secret": "search-keys", "priority_classes": ["default"]},
        {"name": "batch", "api_keys_secret": "batch-keys"},
        {"name": "pods", "service_accounts": ["ml/indexer"]},
    ]
}


def bd(**spec: Any) -> BatchedDeployment:
    return parse_manifest(manifest("minilm", namespace="ml", **spec))


def user_secret(*keys: str) -> dict[str, Any]:
    return {"data": {f"key-{n}": base64.b64encode(key.encode()).decode() for n, key in enumerate(keys)}}


def stored(state: access.AccessState) -> dict[str, Any]:
    """The access Secret as the API server would answer it after the apply."""
    return access.access_secret("minilm", state)


POLICY = AccessPolicy.of(bd(access=ACCESS).spec)


def test_the_signing_key_is_32_random_bytes_made_once_and_kept() -> None:
    first = access.access_state(POLICY, None, {"search-keys": user_secret("a"), "batch-keys": user_secret()})
    assert len(first.signing_key) == 32
    other = access.access_state(POLICY, None, {})
    assert other.signing_key != first.signing_key  # random, not derived from the spec
    again = access.access_state(POLICY, stored(first), {"search-keys": user_secret("b")})
    assert again.signing_key == first.signing_key
    # A key that is not one (edited by hand, truncated) is replaced by a good one.
    broken = {"data": {ACCESS_SIGNING_KEY: base64.b64encode(b"short").decode()}}
    assert len(access.access_state(POLICY, broken, {}).signing_key) == 32


def test_the_secret_holds_the_digests_of_each_tenants_keys_never_the_keys() -> None:
    state = access.access_state(
        POLICY,
        None,
        {"search-keys": user_secret("k-old", "k-new\n", ""), "batch-keys": user_secret("b1")},
    )
    secret = stored(state)
    assert secret["metadata"]["name"] == access_secret_name("minilm") == "minilm-access"
    labels = secret["metadata"]["labels"]
    assert all(labels[k] == v for k, v in (term.split("=") for term in ACCESS_SECRET_SELECTOR.split(",")))
    document = base64.b64decode(secret["data"][ACCESS_KEYS_KEY])
    assert decode_key_digests(document) == {
        # A file's final newline is no part of the key; an empty value is no key.
        "search": frozenset({key_digest("k-old"), key_digest("k-new")}),
        "batch": frozenset({key_digest("b1")}),
    }
    assert b"k-old" not in document and b"b1" not in document
    assert base64.b64decode(secret["data"][ACCESS_SIGNING_KEY]) == state.signing_key
    assert "k-old" not in repr(state) and state.signing_key.hex() not in repr(state)


def test_digests_follow_a_key_removed_and_a_key_added() -> None:
    before = access.access_state(POLICY, None, {"search-keys": user_secret("one", "two"), "batch-keys": {}})
    after = access.access_state(
        POLICY, stored(before), {"search-keys": user_secret("two", "three"), "batch-keys": {}}
    )
    assert after.digests["search"] == {key_digest("two"), key_digest("three")}
    assert after.digests["batch"] == frozenset()


def test_a_missing_secret_is_named_and_its_tenant_keeps_its_last_digests() -> None:
    good = access.access_state(
        POLICY, None, {"search-keys": user_secret("s"), "batch-keys": user_secret("b")}
    )
    missing = access.access_state(
        POLICY, stored(good), {"search-keys": user_secret("s2"), "batch-keys": None}
    )
    assert missing.missing == (("batch", "batch-keys"),)
    assert missing.digests == {"search": {key_digest("s2")}, "batch": {key_digest("b")}}
    condition = access.access_condition(POLICY, missing, generation=3)
    assert (condition.type, condition.status, condition.reason) == ("AccessReady", "False", "SecretMissing")
    assert "'batch-keys'" in condition.message and "tenant 'batch'" in condition.message
    assert condition.observed_generation == 3
    back = access.access_state(POLICY, stored(missing), {"search-keys": {}, "batch-keys": {}})
    assert access.access_condition(POLICY, back, 4).status == "True"


def test_an_open_deployment_gets_a_signing_key_and_says_its_callers_share_one_cache() -> None:
    policy = AccessPolicy.of(bd().spec)
    state = access.access_state(policy, None, {})
    assert len(state.signing_key) == 32 and state.digests == {}
    assert access.user_secrets_named(policy) == frozenset()
    condition = access.access_condition(policy, state, 1)
    assert (condition.status, condition.reason) == ("True", "Open")
    assert "share one prefix cache" in condition.message
    assert access.user_secrets_named(POLICY) == {"search-keys", "batch-keys"}
