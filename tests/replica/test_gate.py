"""One way into a replica: what batchd's router signed, or, at an open deployment, nobody.

Both fronts (the direct path and the ASGI one) are served by a real uvicorn, and every forged
request is the one a pod on the cluster network could send: a tenant header of its own, a stamp
copied from another request, onto another path, made long ago, or signed with another key.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchd.api.headers import FAIRNESS_HEADER, PRIORITY_HEADER, TENANT_HEADER
from batchd.api.manifest import parse_manifest
from batchd.api.stamp import Stamp, signed_headers
from batchd.replica.errors import Unauthenticated
from batchd.replica.front.app import create_app
from batchd.replica.front.gate import Caller, Gate
from batchd.replica.front.server import replica_protocol
from batchd.replica.settings import ReplicaSettings
from batchd.testing.manifests import manifest
from batchd.testing.servers import free_port, replica_process, uvicorn_in_thread, write_manifest
from batchd.testing.waiting import NotYet, eventually

PREDICT = "/v1/models/fenced:predict"
BODY = {"instances": [1, 2]}
ACCESS = {"tenants": [{"name": "acme"}, {"name": "globex"}]}
CLASSES = [{"name": "search", "priority": 10}, {"name": "batch", "priority": 1}]


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("access") / "signing-key"
    path.write_bytes(secrets.token_bytes(32))
    return path


def serve(key_file: Path | None, direct: bool, access: dict[str, Any] | None = ACCESS) -> Iterator[str]:
    spec: dict[str, Any] = {} if access is None else {"access": access}
    batching = {"priority_classes": CLASSES, "default_priority_class": "batch", "batch_wait_timeout_s": 0}
    document = manifest("fenced", batching=batching, **spec)
    app = create_app(parse_manifest(document), ReplicaSettings(signing_key_file=key_file))
    with uvicorn_in_thread(app, http=replica_protocol(app, access_log=not direct)) as url:
        yield url


@pytest.fixture(scope="module", params=["direct", "asgi"])
def fenced(request: pytest.FixtureRequest, key: Path) -> Iterator[str]:
    """A deployment with spec.access, on either front."""
    yield from serve(key, direct=request.param == "direct")


def stamped(key: Path, stamp: Stamp, path: str = PREDICT, now: float | None = None) -> dict[str, str]:
    headers = signed_headers(key.read_bytes(), "POST", path, stamp, now)
    return {name.decode(): value.decode() for name, value in headers}


def refusal(url: str, headers: dict[str, str], path: str = PREDICT) -> str:
    answer = httpx.post(f"{url}{path}", json=BODY, headers=headers, timeout=10)
    assert answer.status_code == 401, answer.text
    return str(answer.json()["error"])


def test_a_stamp_the_router_signed_is_served(fenced: str, key: Path) -> None:
    answer = httpx.post(
        f"{fenced}{PREDICT}", json=BODY, headers=stamped(key, Stamp("acme", "search")), timeout=10
    )
    assert answer.status_code == 200 and answer.json() == {"predictions": [2, 3]}


def test_nothing_unstamped_reaches_the_model_of_a_deployment_with_access(fenced: str) -> None:
    assert "takes requests only through batchd's router" in refusal(fenced, {})
    # What a client writes names nobody: a tenant, a class, a fairness id of its choosing.
    forged = {
        TENANT_HEADER.decode(): "acme",
        PRIORITY_HEADER.decode(): "search",
        FAIRNESS_HEADER.decode(): "a",
    }
    assert "not signed by batchd's router" in refusal(fenced, forged)


def test_forged_stale_replayed_and_moved_stamps_are_refused(fenced: str, key: Path, tmp_path: Path) -> None:
    other_key = tmp_path / "other"
    other_key.write_bytes(secrets.token_bytes(32))
    assert "not signed with this deployment's key" in refusal(
        fenced, stamped(other_key, Stamp("acme", "search"))
    )
    assert "s ago" in refusal(fenced, stamped(key, Stamp("acme", "search"), now=time.time() - 120))
    # A stamp made for another path (a cheaper route, another model) is no stamp for this one.
    moved = stamped(key, Stamp("acme", "search"), path="/v1/models/other:predict")
    assert "not signed with this deployment's key" in refusal(fenced, moved)
    # A stamp's tenant changed after signing: the signature covers it.
    changed = stamped(key, Stamp("globex", "batch")) | {TENANT_HEADER.decode(): "acme"}
    assert "not signed with this deployment's key" in refusal(fenced, changed)
    # A stamp copied off a request the router sent is good once.
    copied = stamped(key, Stamp("acme", "search"))
    assert httpx.post(f"{fenced}{PREDICT}", json=BODY, headers=copied, timeout=10).status_code == 200
    assert "used before" in refusal(fenced, copied)


def test_an_open_deployment_serves_anyone_and_still_refuses_a_forged_stamp(key: Path) -> None:
    for url in serve(key, direct=True, access=None):
        plain = httpx.post(f"{url}{PREDICT}", json=BODY, headers={"batchd-priority": "search"}, timeout=10)
        assert plain.status_code == 200
        assert "not signed" in refusal(url, {TENANT_HEADER.decode(): "acme"})


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "asgi"])
def test_an_open_deployments_callers_are_one_tenant_whatever_they_send(key: Path, direct: bool) -> None:
    """A request that says nothing and one that names a class and a caller: both `anonymous`,
    one prefix-cache scope and one queue share, and one series of items by tenant."""
    for url in serve(key, direct=direct, access=None):
        named = {PRIORITY_HEADER.decode(): "search", FAIRNESS_HEADER.decode(): "someone"}
        for headers in ({}, named):
            assert httpx.post(f"{url}{PREDICT}", json=BODY, headers=headers, timeout=10).status_code == 200
        served = {
            sample.labels["tenant"]: sample.value
            for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)
            for sample in family.samples
            if sample.name == "batchd_tenant_items_total"
        }
        assert served == {"anonymous": 4.0}


def test_without_a_signing_key_a_deployment_with_access_serves_nothing(key: Path) -> None:
    for url in serve(None, direct=False):
        assert "takes requests only through batchd's router" in refusal(url, {})
        assert "no signing key" in refusal(url, stamped(key, Stamp("acme", "search")))
        assert httpx.get(f"{url}/v2/health/ready", timeout=10).status_code == 200  # the kubelet's


def test_a_live_edit_that_removes_access_opens_the_deployment_and_one_that_adds_it_closes_it(
    key: Path, tmp_path: Path
) -> None:
    def document(access: dict[str, Any] | None) -> dict[str, Any]:
        spec: dict[str, Any] = {} if access is None else {"access": access}
        return manifest("fenced", batching={"batch_wait_timeout_s": 0}, **spec)

    path = write_manifest(tmp_path, document(ACCESS))
    env = {"BATCHD_SIGNING_KEY_FILE": str(key), "BATCHD_CONFIG_POLL_S": "0.05"}
    with replica_process(path, tmp_path, env=env) as replica:
        url = replica.url

        def status() -> int:
            return httpx.post(f"{url}{PREDICT}", json=BODY, timeout=10).status_code

        assert status() == 401
        write_manifest(tmp_path, document(None))
        eventually(lambda: status() == 200, what="the open manifest applied")
        write_manifest(tmp_path, document(ACCESS))
        eventually(lambda: status() == 401, what="the access applied again")


def test_metrics_are_served_on_their_own_port_alone(tmp_path: Path) -> None:
    metrics_port = free_port()
    path = write_manifest(tmp_path, manifest("fenced", batching={"batch_wait_timeout_s": 0}))
    with replica_process(path, tmp_path, env={"BATCHD_METRICS_PORT": str(metrics_port)}) as replica:
        metrics = f"http://127.0.0.1:{metrics_port}"
        assert httpx.post(f"{replica.url}{PREDICT}", json=BODY, timeout=10).status_code == 200
        page = httpx.get(f"{metrics}/metrics", timeout=10)
        assert page.status_code == 200 and "batchd_requests_total" in page.text
        assert httpx.get(f"{replica.url}/metrics", timeout=10).status_code == 404
        # Nothing but /metrics there: neither inference (direct or not) nor the rest of the app.
        assert httpx.post(f"{metrics}{PREDICT}", json=BODY, timeout=10).status_code == 404
        assert httpx.get(f"{metrics}/load", timeout=10).status_code == 404
        assert httpx.get(f"{replica.url}/load", timeout=10).status_code == 200


def test_a_tenants_share_of_the_queue_comes_from_its_entitlements(key: Path) -> None:
    access = {"tenants": [{"name": "acme", "queue_share": 0.25}, {"name": "globex"}]}
    document = manifest("fenced", batching={"max_queued_requests": 64}, access=access)
    deployment = parse_manifest(document)
    gate = Gate.reading(lambda: deployment, key)

    def share_of(name: str) -> int | None:
        headers = signed_headers(key.read_bytes(), "POST", PREDICT, Stamp(name, ""))
        return gate.caller("POST", PREDICT, headers).queue_items

    assert (share_of("acme"), share_of("globex")) == (16, 32)  # its own, and an equal share
    open_deployment = parse_manifest(manifest("fenced", batching={"max_queued_requests": 64}))
    assert Gate.reading(lambda: open_deployment, key).caller("POST", PREDICT, []).queue_items is None


KEYS_FILE = """\
apiVersion: v1
kind: Secret
metadata: {name: acme-keys}
stringData: {first: acme-key-one, second: acme-key-two}
---
apiVersion: v1
kind: Secret
metadata: {name: globex-keys}
stringData: {only: globex-key}
"""


def test_batchd_serve_with_api_keys_serves_each_keys_tenant_in_its_own_classes(tmp_path: Path) -> None:
    """`batchd serve --api-keys` (one machine, no router): a caller presents one of the keys of the
    Secrets its tenant names, from a file of those Secrets; whatever headers it writes, it is that
    tenant, in a class that tenant may use."""
    access = {
        "tenants": [
            {"name": "acme", "api_keys_secret": "acme-keys", "priority_classes": ["batch"]},
            {"name": "globex", "api_keys_secret": "globex-keys", "priority_classes": ["search", "batch"]},
        ]
    }
    batching = {"priority_classes": CLASSES, "default_priority_class": "batch", "batch_wait_timeout_s": 0}
    path = write_manifest(tmp_path, manifest("fenced", batching=batching, access=access))
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_FILE)
    with replica_process(path, tmp_path, env={"BATCHD_API_KEYS_FILE": str(keys)}) as replica:
        url = f"{replica.url}{PREDICT}"

        def post(**headers: str) -> httpx.Response:
            return httpx.post(url, json=BODY, headers=headers, timeout=10)

        assert post(authorization="Bearer acme-key-two").json() == {"predictions": [2, 3]}
        assert post(**{"x-api-key": "globex-key", PRIORITY_HEADER.decode(): "search"}).status_code == 200
        for refused in (
            {},
            {"authorization": "Bearer nobody's-key"},
            {"authorization": "Basic YWNtZTprZXk="},
            {
                "authorization": "Bearer acme-key-one",
                TENANT_HEADER.decode(): "globex",
            },  # claims the router's word
        ):
            answer = post(**refused)
            assert answer.status_code == 401, (refused, answer.text)
            assert "acme-key" not in answer.text
        # acme may use `batch` only: the 403 names it, and no class of another tenant's.
        forbidden = post(**{"authorization": "Bearer acme-key-one", PRIORITY_HEADER.decode(): "search"})
        assert forbidden.status_code == 403, forbidden.text
        assert "tenant 'acme' may use batch" in forbidden.text and "search," not in forbidden.text
        unknown = post(**{"authorization": "Bearer acme-key-one", PRIORITY_HEADER.decode(): "gold"})
        assert unknown.status_code == 400 and "expected one of batch, got 'gold'" in unknown.text
        served = {
            sample.labels["tenant"]: sample.value
            for family in text_string_to_metric_families(httpx.get(f"{replica.url}/metrics", timeout=10).text)
            for sample in family.samples
            if sample.name == "batchd_tenant_items_total"
        }
        assert served == {"acme": 2.0, "globex": 2.0}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: ConfigMap\nmetadata: {name: x}\n", "document 0: expected a Secret with a metadata.name"),
        ("kind: Secret\nmetadata: {name: empty}\n", "Secret 'empty' holds no API key"),
        ("kind: Secret\n  metadata: [", "not YAML"),
        (KEYS_FILE, "has no spec.access"),  # keys for a deployment that serves everyone
    ],
)
def test_a_bad_api_keys_file_stops_batchd_serve_naming_the_file_and_why(
    tmp_path: Path, content: str, message: str
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(content)
    access = None if message == "has no spec.access" else ACCESS
    path = write_manifest(tmp_path, manifest("fenced", access=access))
    done = subprocess.run(
        [sys.executable, "-m", "batchd.replica.cli", "serve", str(path), "--api-keys", str(keys)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert str(keys) in done.stderr and message in done.stderr


def test_a_new_signing_key_is_believed_once_its_file_has_it_and_the_old_one_is_not(tmp_path: Path) -> None:
    """The operator makes a new key where the access Secret was deleted; the kubelet updates the
    mounted file; the router signs with the new key from its watch. The replica follows the file
    without a restart, and stamps of the old key stop checking."""
    key_file = tmp_path / "signing-key"
    old, new = secrets.token_bytes(32), secrets.token_bytes(32)
    key_file.write_bytes(old)
    deployment = parse_manifest(manifest("fenced", access=ACCESS))
    gate = Gate.reading(lambda: deployment, key_file)

    def as_signed_by(key: bytes) -> Caller | NotYet:
        headers = signed_headers(key, "POST", PREDICT, Stamp("acme", ""))
        try:
            return gate.caller("POST", PREDICT, headers)
        except Unauthenticated as refused:
            return NotYet(str(refused))

    assert isinstance(as_signed_by(old), Caller)
    key_file.write_bytes(new)
    assert eventually(lambda: as_signed_by(new), timeout_s=10, what="the new key believed").tenant == "acme"
    assert isinstance(as_signed_by(old), NotYet)
