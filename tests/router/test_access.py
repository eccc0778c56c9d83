"""Who a caller is, decided at the router: API keys by digest, anonymous where allowed, the access
Secret read, and a request through the real router to a fake replica that sees only the stamp.

Pure parts run on their own; the request path runs on the real router process and API server, with
real access Secrets (as the operator writes them) and a BatchedDeployment's spec.access."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from batchd.api.access import AccessPolicy, granted_class, key_digest
from batchd.api.headers import STAMP_HEADER, TENANT_HEADER
from batchd.api.manifest import lenient_spec
from batchd.api.pod import INSTANCE_LABEL
from batchd.api.priority import PriorityClasses, UnknownPriorityClass
from batchd.api.stamp import ReplayGuard, verified
from batchd.router.access import (
    Forbidden,
    Keyring,
    Unauthenticated,
    caller_of,
    credentials_of,
    looks_like_token,
    presented,
)
from batchd.router.directory import DeploymentRef
from batchd.testing.kubernetes.routed import SIGNING_KEY, access_secret

PREDICT = "/v1/models/adder:predict"
CLASSES = [
    {"name": "search", "priority": 1},
    {"name": "indexing", "priority": 0},
    {"name": "default", "priority": -1},
]
ACCESS = {
    "tenants": [
        {"name": "team-a", "api_keys_secret": "team-a-keys", "priority_classes": ["indexing"]},
        {"name": "team-b", "api_keys_secret": "team-b-keys", "priority_classes": ["search", "indexing"]},
    ]
}
REF = DeploymentRef("ml", "adder")


def policy(access: dict[str, Any] | None = ACCESS) -> AccessPolicy:
    spec: dict[str, Any] = {"model": {"handler": "x:y"}, "batching": {"priority_classes": CLASSES}}
    if access is not None:
        spec["access"] = access
    return AccessPolicy.of(lenient_spec(spec))


def keyring(keys: dict[str, list[str]]) -> Keyring:
    found = Keyring()
    found.put_secret(access_secret(REF.name, REF.namespace, keys))
    return found


# -- pure parts -----------------------------------------------------------------------------------


def test_the_access_secret_gives_the_signing_key_and_each_keys_tenant_by_digest() -> None:
    credentials = credentials_of(access_secret("adder", "ml", {"team-a": ["a1", "a2"], "team-b": ["b1"]}))
    assert credentials.signing_key == SIGNING_KEY
    assert credentials.tenants_by_digest == {
        key_digest("a1"): "team-a",
        key_digest("a2"): "team-a",
        key_digest("b1"): "team-b",
    }
    ring = keyring({"team-a": ["a1"]})
    assert ring.get(REF) is not None
    ring.delete_secret(access_secret(REF.name, REF.namespace, {}))
    assert ring.get(REF) is None


def test_only_the_secret_named_for_a_deployment_holds_its_keys() -> None:
    """A Secret with the access labels under another name (a tenant's own keys Secret, which the
    tenant may write) neither replaces a deployment's keys nor, deleted, removes them."""
    ring = keyring({"team-a": ["a1"]})
    forged = access_secret(REF.name, REF.namespace, {"team-b": ["mine"]})
    forged["metadata"]["name"] = "team-b-keys"
    ring.put_secret(forged)
    ring.delete_secret(forged)
    found = ring.get(REF)
    assert found is not None and found.tenants_by_digest == {key_digest("a1"): "team-a"}
    # Named for one deployment, labelled for another: nobody's.
    mislabelled = access_secret("other", REF.namespace, {"team-b": ["mine"]})
    mislabelled["metadata"]["labels"][INSTANCE_LABEL] = REF.name
    ring.put_secret(mislabelled)
    assert ring.get(DeploymentRef(REF.namespace, "other")) is None
    assert ring.get(REF) == found


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"authorization", b"Bearer sk-1")], b"sk-1"),
        ([(b"Authorization", b"bearer  sk-1 ")], b"sk-1"),
        ([(b"x-api-key", b"sk-2")], b"sk-2"),
        ([(b"content-type", b"application/json")], None),
    ],
)
def test_a_credential_is_a_bearer_or_an_api_key(headers: list[tuple[bytes, bytes]], expected: bytes) -> None:
    assert presented(headers) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"Basic dXNlcjpwYXNz", "bad_scheme"),
        (b"Bearer ", "empty_credential"),
        (b"Bearer " + b"x" * 2**20, "too_long"),
    ],
)
def test_a_malformed_credential_is_refused_naming_why_never_the_credential(value: bytes, reason: str) -> None:
    with pytest.raises(Unauthenticated) as refused:
        presented([(b"authorization", value)])
    assert refused.value.reason == reason
    assert value.partition(b" ")[2][:8].decode() not in str(refused.value) or not value.partition(b" ")[2]


def test_a_token_is_told_from_a_key_by_its_shape() -> None:
    assert looks_like_token(b"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln")
    assert not looks_like_token(b"sk-abc.def")


async def test_callers_are_their_keys_tenants_and_nobody_else() -> None:
    ring = keyring({"team-a": ["key-a"], "team-b": ["key-b"]})
    found = await caller_of(policy(), REF, [(b"x-api-key", b"key-a")], ring.get(REF), None)
    assert found.tenant.name == "team-a"
    found = await caller_of(policy(), REF, [(b"authorization", b"Bearer key-b")], ring.get(REF), None)
    assert found.tenant.name == "team-b"
    for headers, reason in (([], "no_credential"), ([(b"x-api-key", b"key-c")], "unknown_key")):
        with pytest.raises(Unauthenticated) as refused:
            await caller_of(policy(), REF, headers, ring.get(REF), None)
        assert refused.value.reason == reason and refused.value.tenant == "unknown"
        assert "key-c" not in str(refused.value)
    # A key removed from the digests is refused from the next read of the Secret on.
    ring.put_secret(access_secret(REF.name, REF.namespace, {"team-a": [], "team-b": ["key-b"]}))
    with pytest.raises(Unauthenticated):
        await caller_of(policy(), REF, [(b"x-api-key", b"key-a")], ring.get(REF), None)


async def test_anonymous_callers_only_where_the_deployment_allows_them() -> None:
    allowed = policy({**ACCESS, "anonymous": {"priority_classes": ["indexing"]}})
    found = await caller_of(allowed, REF, [], None, None)
    assert found.tenant.name == "anonymous"
    # An open deployment: everyone is one tenant, whatever they present.
    found = await caller_of(policy(None), REF, [(b"x-api-key", b"whatever")], None, None)
    assert found.tenant.name == "anonymous" and found.tenant.classes is None
    # Its composers say who they are, so that a class the callee lacks falls back to its default.
    composed = await caller_of(policy(None), REF, [(b"batchd-called-by", b"composer")], None, None)
    assert composed.called_by == "composer"
    spec = {"model": {"handler": "x:y"}, "batching": {"priority_classes": CLASSES}}
    classes = PriorityClasses.of(lenient_spec(spec).batching)
    assert granted_class(composed.tenant, classes, "gold", composed=True).name == "default"
    with pytest.raises(UnknownPriorityClass):  # the same class, asked by no composer
        granted_class(found.tenant, classes, "gold", composed=bool(found.called_by))


class Reviewed:
    """A stand-in for the token reviews: the account each token proves."""

    def __init__(self, account: str) -> None:
        self.account_of = account

    async def account(self, token: bytes, ref: DeploymentRef) -> str:
        return self.account_of


async def test_a_token_is_its_accounts_tenant_and_an_account_of_no_tenant_is_forbidden() -> None:
    access = {**ACCESS, "tenants": [{**ACCESS["tenants"][0], "service_accounts": ["ml/composer"]}]}
    token = [(b"authorization", b"Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln")]
    found = await caller_of(policy(access), REF, token, None, Reviewed("ml/composer"), lambda ref: True)
    assert (found.tenant.name, found.called_by) == ("team-a", "composer")
    with pytest.raises(Forbidden) as refused:
        await caller_of(policy(access), REF, token, None, Reviewed("ml/other"))
    assert refused.value.reason == "no_tenant"


# -- through the router ---------------------------------------------------------------------------


async def post(
    client: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], Any]:
    async with client.post(url, json={"instances": [1]}, headers=headers) as answer:
        return answer.status, await answer.json(), answer.headers


async def test_only_a_tenants_key_reaches_the_replica_and_the_replica_sees_only_the_stamp(
    cluster: Any, fakes: Any
) -> None:
    replica = fakes("ok")
    namespace = cluster.namespace
    secrets = f"/api/v1/namespaces/{namespace}/secrets"
    secret = access_secret("adder", namespace, {"team-a": ["key-a"], "team-b": ["key-b"]})
    assert cluster.api.post(secrets, json=secret).is_success
    await cluster.deploy("adder", replica.address, batching={"priority_classes": CLASSES}, access=ACCESS)
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        url = router.url + PREDICT
        status, body, headers = await post(client, url)
        assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="batchd"', body
        status, body, _ = await post(client, url, {"Authorization": "Bearer wrong-key"})
        assert status == 401 and "wrong-key" not in body["error"], body
        forged = {
            "Authorization": "Bearer key-a",
            "batchd-tenant": "team-b",
            "batchd-priority": "search",
            "batchd-fairness-id": "victim",
            "batchd-stamp": "v1 t=1 n=x s=y",
        }
        status, body, _ = await post(client, url, forged)
        # team-a may use indexing only: the 403 names its classes, and no other tenant's.
        assert status == 403, body
        assert body["error"] == "model 'adder': priority class 'search': tenant 'team-a' may use indexing"
        status, body, _ = await post(client, url, {**forged, "batchd-priority": "indexing"})
        assert status == 200, body
        status, body, _ = await post(client, url, {"x-api-key": "key-b"})
        assert status == 200, body
        assert replica.received == 2  # the refused never reached it
        first, second = replica.headers[:2]
        # A key removed from the Secret is refused once the router has read the change.
        secret = access_secret("adder", namespace, {"team-a": [], "team-b": ["key-b"]})
        patch = {"data": secret["data"]}
        merge = {"Content-Type": "application/merge-patch+json"}
        assert cluster.api.patch(f"{secrets}/adder-access", json=patch, headers=merge).is_success

        async def refused() -> bool:
            return (await post(client, url, {"x-api-key": "key-a"}))[0] == 401

        await cluster.eventually(refused, what="the removed key refused")
        async with client.get(f"{cluster.admin_url}/metrics") as answer:
            metrics = await answer.text()
    namespace_label = f'namespace="{namespace}"'
    for code, reason, tenant in (("403", "not_entitled", "team-a"), ("401", "no_credential", "unknown")):
        series = f'code="{code}",deployment="adder",{namespace_label},reason="{reason}",tenant="{tenant}"'
        assert f"batchd_router_refusals_total{{{series}}} 1.0" in metrics, series
    # (The removed key is served until the router reads the change: those requests come after.)
    for seen in (first, second):
        assert b"authorization" not in seen and b"x-api-key" not in seen
    assert (first[TENANT_HEADER], first[b"batchd-priority"], first.get(b"batchd-fairness-id")) == (
        b"team-a",
        b"indexing",
        b"victim",  # the caller within its tenant, as it named itself: fair shares there only
    )
    assert (second[TENANT_HEADER], second[b"batchd-priority"]) == (b"team-b", b"search")
    guard = ReplayGuard()
    for seen in (first, second):
        stamp = verified(SIGNING_KEY, "POST", PREDICT, list(seen.items()), guard)
        assert stamp.tenant == seen[TENANT_HEADER].decode() and seen[STAMP_HEADER].startswith(b"v1 ")


async def test_a_tenant_past_its_requests_a_second_gets_429_with_openais_headers(
    cluster: Any, fakes: Any
) -> None:
    replica = fakes("ok")
    namespace = cluster.namespace
    secret = access_secret("adder", namespace, {"team-a": ["key-a"]})
    assert cluster.api.post(f"/api/v1/namespaces/{namespace}/secrets", json=secret).is_success
    access = {"tenants": [{"name": "team-a", "api_keys_secret": "team-a-keys", "requests_per_s": 1}]}
    await cluster.deploy("adder", replica.address, access=access)
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        answers = [await post(client, router.url + PREDICT, {"x-api-key": "key-a"}) for _ in range(4)]
    statuses = [status for status, _, _ in answers]
    assert statuses[0] == 200 and 429 in statuses, statuses
    _, body, headers = next(answer for answer in answers if answer[0] == 429)
    assert body["error"] == f"deployment {namespace}/adder: tenant 'team-a' is past its requests_per_s"
    assert headers["Retry-After"] == "1"
    assert headers["x-ratelimit-limit-requests"] == "1"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert replica.received == statuses.count(200)


async def test_a_key_before_the_router_has_read_the_access_secret_waits_its_turn_not_refused(
    cluster: Any, fakes: Any
) -> None:
    """A new deployment whose access Secret the router has not read yet: its callers' keys are
    not refused as unknown (401), they are told to come back (503), and once the Secret is read
    the same key is served."""
    replica = fakes("ok")
    await cluster.deploy("adder", replica.address, batching={"priority_classes": CLASSES}, access=ACCESS)
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        url = router.url + PREDICT
        status, body, headers = await post(client, url, {"x-api-key": "key-b"})
        assert status == 503 and "Retry-After" in headers, body
        secret = access_secret("adder", cluster.namespace, {"team-b": ["key-b"]})
        assert cluster.api.post(f"/api/v1/namespaces/{cluster.namespace}/secrets", json=secret).is_success

        async def served() -> bool:
            return (await post(client, url, {"x-api-key": "key-b"}))[0] == 200

        await cluster.eventually(served, what="the key served once the Secret is read")
    assert replica.received >= 1


async def test_an_untraced_router_passes_a_sampled_flag_on_only_from_a_trusted_tenant(
    cluster: Any, fakes: Any
) -> None:
    """With no tracing at the router, the replica (which may trace) still gets an untrusted
    caller's trace with the flag off, and a trusted one's as it came."""
    replica = fakes("ok")
    secret = access_secret("adder", cluster.namespace, {"plain": ["plain-key"], "trusted": ["trusted-key"]})
    assert cluster.api.post(f"/api/v1/namespaces/{cluster.namespace}/secrets", json=secret).is_success
    access = {
        "tenants": [
            {"name": "plain", "api_keys_secret": "plain-keys"},
            {"name": "trusted", "api_keys_secret": "trusted-keys", "trust_traces": True},
        ]
    }
    await cluster.deploy("adder", replica.address, access=access)
    sampled = "00-5bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01"
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        for key in ("plain-key", "trusted-key"):
            headers = {"x-api-key": key, "traceparent": sampled}
            status, body, _ = await post(client, router.url + PREDICT, headers)
            assert status == 200, body
    plain, trusted = (seen[b"traceparent"].decode() for seen in replica.headers)
    assert plain == sampled.removesuffix("-01") + "-00"
    assert trusted == sampled
