"""Callers you can trust, end to end on a real cluster: the chart's operator and two routers in pods
from our images, API keys in real Secrets, ServiceAccount tokens from the API server checked by
its own TokenReview and SubjectAccessReview, replicas that believe only what a router signed, and
NetworkPolicy enforced on the node by kube-router's policy controller.

What a caller notices: without a credential, or with a wrong one, it is refused (401), and with
its own it is served as its tenant whatever identity headers it writes; a key taken out of its
Secret stops working within seconds, a new one starts; it gets only the classes its tenant may use
(403 names only those); its quota holds over both routers (429 with Retry-After); another tenant's
prompt is never a cache hit for it; a replica reached around the router refuses a forged or
replayed stamp, and with the policy enforced is not reached at all.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchd.api.pod import (
    ACCESS_SIGNING_KEY,
    REPLICA_METRICS_PORT,
    REPLICA_PORT,
    access_secret_name,
)
from batchd.api.stamp import Stamp, signed_headers
from batchd.testing.kubernetes import handlers
from batchd.testing.kubernetes.components import forbidden
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.policies import enforced
from batchd.testing.kubernetes.release import Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.models import build_gpt2
from batchd.testing.waiting import NotYet, eventually

pytestmark = pytest.mark.slow

START_S = 240.0
GUARDED, CHAT = "guarded", "chat"
TWO_ROUTERS: dict[str, Any] = {"router": {"replicaCount": 2, "resources": {"requests": {"cpu": "100m"}}}}
KEYS = {
    "alpha": ["alpha-key-0123456789abcdef0123456789", "alpha-key-second-0123456789abcdef01"],
    "beta": ["beta-key-0123456789abcdef0123456789ab"],
    "metered": ["metered-key-0123456789abcdef01234567"],
    "thrifty": ["thrifty-key-0123456789abcdef0123456"],
}
METERED_RPS = 5.0
THRIFTY_TPM = 150
ADDER = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0.02}}
BATCHING = {
    "max_batch_size": 8,
    "batch_wait_timeout_s": 0.005,
    "max_queued_requests": 64,
    "priority_classes": [{"name": "search", "priority": 10}, {"name": "indexing", "priority": 0}],
    "default_priority_class": "indexing",
}
GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 512}
PROMPT = "The quarterly figures of the confidential merger, line by line: " * 6


def key_secret(tenant: str, keys: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{tenant}-keys"},
        "stringData": {f"key-{n}": key for n, key in enumerate(keys)},
    }


def service_account(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}


@dataclass(frozen=True)
class Stack:
    release: Release

    @property
    def cluster(self) -> ControlPlane:
        return self.release.cluster

    @property
    def router(self) -> str:
        return self.release.router_url()

    def pods(self, name: str) -> list[str]:
        def probe() -> list[str] | NotYet:
            ready = self.release.pods(name, ready=True)
            return [p["status"]["podIP"] for p in ready] or NotYet(f"{len(self.release.pods(name))} pods")

        return eventually(probe, timeout_s=START_S, what=f"a ready pod of {name}")

    def token(self, account: str, audience: str = "batchd") -> str:
        return self.cluster.kubectl(
            "create", "token", account, "-n", self.release.namespace, f"--audience={audience}"
        ).stdout.strip()

    def signing_key(self, name: str) -> bytes:
        secret = self.release.get("secret", access_secret_name(name))
        assert secret is not None
        return base64.b64decode(secret["data"][ACCESS_SIGNING_KEY])


@pytest.fixture(scope="module")
def stack(
    control_plane: ControlPlane, kube_node: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("access")
    with installed(control_plane, logs, TWO_ROUTERS, wait=True) as release:
        ns = release.namespace
        release.apply(handlers.config_map())
        release.apply(handlers.model_config_map(build_gpt2(logs / "gpt2", **GPT2)), server_side=True)
        release.apply(*(key_secret(tenant, keys) for tenant, keys in KEYS.items()))
        release.apply(service_account("prober"), service_account("stranger"))
        release.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "prober-invokes"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": f"{release.name}-invoker",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "prober", "namespace": ns}],
            }
        )
        guarded_access = {
            "tenants": [
                {
                    "name": "alpha",
                    "api_keys_secret": "alpha-keys",
                    "priority_classes": ["search", "indexing"],
                },
                {"name": "beta", "api_keys_secret": "beta-keys", "priority_classes": ["indexing"]},
                {"name": "metered", "api_keys_secret": "metered-keys", "requests_per_s": METERED_RPS},
                {"name": "robots", "service_accounts": [f"{ns}/prober", f"{ns}/stranger"]},
            ]
        }
        release.apply(
            manifest(GUARDED, ADDER, batching=BATCHING, access=guarded_access, **handlers.pod_spec())
        )
        chat_model = {
            "name": CHAT,
            "task": "text-generation",
            "source": handlers.model_source(),
            "device": "cpu",
            "generation": {"max_new_tokens": 4, "prefix_cache_bytes": 16 << 20},
        }
        chat_access = {
            "tenants": [
                {"name": "alpha", "api_keys_secret": "alpha-keys"},
                {"name": "beta", "api_keys_secret": "beta-keys"},
                {"name": "thrifty", "api_keys_secret": "thrifty-keys", "tokens_per_minute": THRIFTY_TPM},
            ]
        }
        release.apply(
            manifest(CHAT, chat_model, access=chat_access, **handlers.pod_spec_with_model()), server_side=True
        )
        stack = Stack(release)
        stack.pods(GUARDED)
        stack.pods(CHAT)
        yield stack
        assert forbidden(control_plane, release.router_user) == []
        assert forbidden(control_plane, release.operator_user) == []


def predict_url(stack: Stack, model: str = GUARDED) -> str:
    return f"{stack.router}/v1/models/{model}:predict"


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def served(stack: Stack, headers: dict[str, str], n: int = 1, timeout_s: float = 30) -> httpx.Response:
    """The first answer the router gives (a Service's address answers once kube-proxy programs it)."""
    return stack.release.first_answer(predict_url(stack), {"instances": [n]}, timeout_s, headers=headers)


def counted(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples in a /metrics page whose labels include `labels`."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def router_total(stack: Stack, name: str, **labels: str) -> float:
    return sum(
        counted(httpx.get(f"{admin}/metrics", timeout=10).text, name, **labels)
        for admin in stack.release.router_admin_urls()
    )


# -- who is calling ----------------------------------------------------------------------------------


def test_a_request_without_a_credential_or_with_a_wrong_one_is_refused_and_a_right_key_is_served(
    stack: Stack,
) -> None:
    nobody = served(stack, {})
    assert nobody.status_code == 401, nobody.text
    assert nobody.headers["www-authenticate"].startswith("Bearer")
    wrong = served(stack, bearer("not-a-key-of-anyone-0123456789abcdef"))
    assert wrong.status_code == 401, wrong.text
    for headers in (bearer(KEYS["alpha"][0]), {"x-api-key": KEYS["alpha"][1]}):
        right = served(stack, headers, n=3)
        assert right.status_code == 200, right.text
        assert right.json()["predictions"] == [4]
    # What a client writes of identity is not what the replica is told.
    forged = served(stack, {**bearer(KEYS["beta"][0]), "batchd-tenant": "alpha", "batchd-priority": "search"})
    assert forged.status_code == 403, forged.text
    assert "search" in forged.text and "indexing" in forged.text


def test_the_openai_client_authenticates_with_its_api_key(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.router}/v1", api_key=KEYS["alpha"][0], max_retries=0)
    answer = client.completions.create(model=CHAT, prompt="Hello there", max_tokens=2, temperature=0)
    assert answer.usage is not None and answer.usage.completion_tokens == 2
    refused = openai.OpenAI(
        base_url=f"{stack.router}/v1", api_key="wrong-key-0123456789abcdef", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        refused.completions.create(model=CHAT, prompt="Hello there", max_tokens=2)


def test_a_key_removed_from_its_secret_is_refused_and_a_key_added_is_served_without_a_restart(
    stack: Stack,
) -> None:
    rotated = "alpha-key-rotated-0123456789abcdef0123"
    assert served(stack, bearer(KEYS["alpha"][1])).status_code == 200
    stack.release.apply(key_secret("alpha", [KEYS["alpha"][0], rotated]))
    try:
        started = time.monotonic()
        eventually(
            lambda: served(stack, bearer(rotated)).status_code == 200,
            timeout_s=10,
            what="the new key to be served",
        )
        eventually(
            lambda: served(stack, bearer(KEYS["alpha"][1])).status_code == 401,
            timeout_s=max(0.5, 10 - (time.monotonic() - started)),
            what="the removed key to be refused",
        )
    finally:
        stack.release.apply(key_secret("alpha", KEYS["alpha"]))
    eventually(
        lambda: served(stack, bearer(KEYS["alpha"][1])).status_code == 200, timeout_s=10, what="the key back"
    )


def test_service_account_tokens_are_reviewed_by_the_api_server_and_cached(stack: Stack) -> None:
    token = stack.token("prober")
    assert served(stack, bearer(token)).status_code == 200
    reviews_before = tokenreviews(stack)
    answers = [served(stack, bearer(token), n=n).status_code for n in range(40)]
    assert answers == [200] * 40
    # Each router reviews a token once a TTL: two routers, at most two reviews.
    assert tokenreviews(stack) - reviews_before <= 2
    other_audience = served(stack, bearer(stack.token("prober", audience="somebody-else")))
    assert other_audience.status_code == 401, other_audience.text
    not_granted = served(stack, bearer(stack.token("stranger")))
    assert not_granted.status_code == 403, not_granted.text


def tokenreviews(stack: Stack) -> int:
    return stack.cluster.created(stack.release.router_user, "tokenreviews")


@pytest.mark.parametrize(
    "authorization",
    ["Bearer not.a.token", "Bearer " + "x" * (1 << 20), "Bearer", "Basic dXNlcjpwYXNz"],
    ids=["malformed-token", "one-megabyte", "empty-key", "basic"],
)
def test_a_malformed_credential_is_refused_and_the_router_stays_up(stack: Stack, authorization: str) -> None:
    try:
        answer = httpx.post(
            predict_url(stack), json={"instances": [1]}, headers={"authorization": authorization}, timeout=30
        )
        assert 400 <= answer.status_code < 500, answer.text[:200]
    except httpx.RemoteProtocolError:
        pass  # a 1 MB header may be refused by the HTTP server before an answer is written
    assert served(stack, bearer(KEYS["alpha"][0])).status_code == 200


def test_the_router_passes_no_path_a_replica_does_not_serve_for_inference(stack: Stack) -> None:
    ns = stack.release.namespace
    for path in ("metrics", "load", "docs", "openapi.json"):
        answer = httpx.get(
            f"{stack.router}/deployments/{ns}/{GUARDED}/{path}", headers=bearer(KEYS["alpha"][0]), timeout=10
        )
        assert answer.status_code == 404, (path, answer.text)


# -- what a tenant may do -----------------------------------------------------------------------------


def test_another_tenants_prompt_is_never_a_cache_hit_whatever_the_caller_claims(stack: Stack) -> None:
    url = f"{stack.router}/v1/completions"

    def cached(key: str, prompt: str, **headers: str) -> int:
        body = {"model": CHAT, "prompt": prompt, "max_tokens": 1, "temperature": 0, "user": "a"}
        answer = httpx.post(url, json=body, headers={**bearer(key), **headers}, timeout=60)
        assert answer.status_code == 200, answer.text
        return int(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    # Beta claims alpha's caller and tenant, in the headers and the body's `user`: each prompt is
    # one alpha has cached and beta never sent, so only alpha's blocks could answer it.
    forged = {"batchd-fairness-id": "a", "batchd-tenant": "alpha"}
    for attempt in range(3):
        prompt = f"{attempt}: {PROMPT}"
        cached(KEYS["alpha"][0], prompt)
        assert cached(KEYS["alpha"][0], prompt) > 0  # the positive control: alpha's own blocks
        assert cached(KEYS["beta"][0], prompt, **forged) == 0, f"beta hit alpha's prompt {attempt}"
        assert cached(KEYS["beta"][0], prompt) > 0  # beta's own blocks, once it has sent it


def test_a_class_the_tenant_may_not_use_is_refused_naming_only_its_own_classes(stack: Stack) -> None:
    refused = served(stack, {**bearer(KEYS["beta"][0]), "batchd-priority": "search"})
    assert refused.status_code == 403
    assert "'search'" in refused.text and "indexing" in refused.text
    unknown = served(stack, {**bearer(KEYS["beta"][0]), "batchd-priority": "platinum"})
    assert unknown.status_code == 400 and "search" not in unknown.text, unknown.text
    assert served(stack, {**bearer(KEYS["alpha"][0]), "batchd-priority": "search"}).status_code == 200


def displaced(stack: Stack) -> float:
    """Requests the guarded deployment's replicas gave up to a higher class, from their metrics port."""
    return sum(
        counted(
            httpx.get(f"http://{pod}:{REPLICA_METRICS_PORT}/metrics", timeout=10).text,
            "batchd_class_refusals_total",
            reason="displaced",
        )
        for pod in stack.pods(GUARDED)
    )


async def test_a_claim_to_a_class_not_granted_displaces_nothing_from_a_busy_queue(stack: Stack) -> None:
    before = displaced(stack)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:

        async def send(key: str, priority: str, n: int) -> int:
            headers = {**bearer(key), "batchd-priority": priority}
            async with client.post(predict_url(stack), json={"instances": [n]}, headers=headers) as answer:
                await answer.read()
                return answer.status

        # Alpha's indexing keeps the queue busy while beta claims search again and again.
        queued = [asyncio.create_task(send(KEYS["alpha"][0], "indexing", n)) for n in range(48)]
        claims = await asyncio.gather(*(send(KEYS["beta"][0], "search", n) for n in range(16)))
        answers = await asyncio.gather(*queued)
    assert set(claims) == {403}
    assert set(answers) <= {200, 503}  # served, or refused by a full queue: never displaced
    assert displaced(stack) == before


async def test_a_quota_holds_over_both_routers_and_leaves_other_tenants_alone(stack: Stack) -> None:
    assert len(stack.release.router_admin_urls()) == 2
    duration_s, rate = 6.0, 3 * METERED_RPS
    # The Service balances connections: a connection per request spreads them over both routers.
    spread = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=spread, timeout=aiohttp.ClientTimeout(total=30)) as client:

        async def send(key: str) -> tuple[int, float, dict[str, str]]:
            started = time.monotonic()
            async with client.post(
                predict_url(stack), json={"instances": [1]}, headers=bearer(key)
            ) as answer:
                await answer.read()
                headers = {name.lower(): value for name, value in answer.headers.items()}
                return answer.status, time.monotonic() - started, headers

        metered: list[asyncio.Task[tuple[int, float, dict[str, str]]]] = []
        other: list[asyncio.Task[tuple[int, float, dict[str, str]]]] = []
        started = time.monotonic()
        for n in range(int(duration_s * rate)):
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
            metered.append(asyncio.create_task(send(KEYS["metered"][0])))
            if n % 3 == 0:
                other.append(asyncio.create_task(send(KEYS["alpha"][0])))
        results = await asyncio.gather(*metered)
        others = await asyncio.gather(*other)
    admitted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 429]
    assert len(admitted) + len(refused) == len(results), {r[0] for r in results}
    quota = METERED_RPS * duration_s
    # A bucket starts full (a second's worth on each router), so a little over the quota in all.
    assert 0.8 * quota <= len(admitted) <= quota + METERED_RPS + 2, (len(admitted), quota)
    headers = refused[0][2]
    assert float(headers["retry-after"]) > 0
    assert headers["x-ratelimit-limit-requests"] and headers["x-ratelimit-remaining-requests"] == "0"
    assert {r[0] for r in others} == {200}
    assert router_total(stack, "batchd_router_refusals_total", tenant="metered", code="429") >= len(refused)


def test_a_tenants_tokens_per_minute_are_counted_from_the_usage_the_replica_reports(stack: Stack) -> None:
    url = f"{stack.router}/v1/completions"
    body = {"model": CHAT, "prompt": "Count these words for the meter.", "max_tokens": 4, "temperature": 0}
    statuses = []
    for _ in range(60):
        answer = httpx.post(url, json=body, headers=bearer(KEYS["thrifty"][0]), timeout=60)
        statuses.append(answer.status_code)
        if answer.status_code == 429:
            assert answer.headers["x-ratelimit-limit-tokens"]
            assert float(answer.headers["retry-after"]) > 0
            break
    assert statuses[-1] == 429, statuses
    # Each answer is about a dozen tokens: the quota is spent after about a dozen answers on one
    # router, twice that over two.
    assert 2 <= len(statuses) - 1 <= 40, statuses


# -- only the router reaches the replicas ---------------------------------------------------------------


def test_a_replica_reached_around_the_router_refuses_forged_and_replayed_stamps(stack: Stack) -> None:
    (pod, *_) = stack.pods(GUARDED)
    service = stack.release.service_url(GUARDED, REPLICA_PORT)
    key = stack.signing_key(GUARDED)
    path = f"/v1/models/{GUARDED}:predict"
    for base in (f"http://{pod}:{REPLICA_PORT}", service):
        url = base + path
        unstamped = stack.release.first_answer(url, {"instances": [1]}, headers={"batchd-tenant": "alpha"})
        assert unstamped.status_code == 401, unstamped.text
        forged = dict(signed_headers(b"k" * 32, "POST", path, Stamp("alpha", "search")))
        answer = httpx.post(url, json={"instances": [1]}, headers=_text(forged), timeout=10)
        assert answer.status_code == 401, answer.text
        good = _text(dict(signed_headers(key, "POST", path, Stamp("alpha", "search"))))
        assert httpx.post(url, json={"instances": [1]}, headers=good, timeout=10).status_code == 200
        replayed = httpx.post(url, json={"instances": [1]}, headers=good, timeout=10)
        assert replayed.status_code == 401, replayed.text
        elsewhere = _text(
            dict(signed_headers(key, "POST", "/v1/models/other:predict", Stamp("alpha", "search")))
        )
        assert httpx.post(url, json={"instances": [1]}, headers=elsewhere, timeout=10).status_code == 401


def _text(headers: dict[bytes, bytes]) -> dict[str, str]:
    return {name.decode(): value.decode() for name, value in headers.items()}


def test_with_the_network_policy_enforced_only_the_router_reaches_the_replicas(
    stack: Stack, kube_node: Node
) -> None:
    (pod, *_) = stack.pods(GUARDED)
    direct = f"http://{pod}:{REPLICA_PORT}/-/healthy"
    assert httpx.get(direct, timeout=5).status_code in (200, 404)  # reached, before
    with enforced(kube_node):

        def blocked() -> bool | NotYet:
            try:
                httpx.get(direct, timeout=1)
                return NotYet("answered")
            except httpx.TransportError:
                return True

        eventually(blocked, timeout_s=30, what="the node to drop the host's traffic to the replica")
        assert served(stack, bearer(KEYS["alpha"][0])).status_code == 200
        assert kube_node.ready()


def test_a_missing_key_secret_is_reported_and_the_last_good_keys_keep_serving(stack: Stack) -> None:
    release = stack.release
    document = manifest(GUARDED, ADDER, batching=BATCHING, **handlers.pod_spec())
    live = release.get("bd", GUARDED)
    assert live is not None
    access = dict(live["spec"]["access"])
    access["tenants"] = [*access["tenants"], {"name": "gamma", "api_keys_secret": "gamma-keys"}]
    document["spec"]["access"] = access
    release.apply(document)
    try:
        condition = eventually(
            lambda: (c := release.condition(GUARDED, "AccessReady")).get("status") == "False" and c,
            timeout_s=30,
            what="AccessReady False",
        )
        assert "gamma-keys" in condition["message"]
        eventually(
            lambda: release.events("SecretMissing", GUARDED), timeout_s=30, what="a SecretMissing event"
        )
        assert served(stack, bearer(KEYS["alpha"][0])).status_code == 200
    finally:
        document["spec"]["access"] = live["spec"]["access"]
        release.apply(document)
    eventually(
        lambda: release.condition(GUARDED, "AccessReady").get("status") == "True",
        timeout_s=30,
        what="AccessReady True",
    )
