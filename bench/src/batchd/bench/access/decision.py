"""What deciding who calls costs, in one process: the router's own code for one request of each way
in, timed in a loop (its CPU per request is what this adds; the end-to-end rounds measure the
same on a shared machine, where the rounds of one way spread wider than the goal).

Per request, as `proxy.Proxy._route` does it: the client's headers stripped of the identity headers
(`upstream.request_headers`), the caller decided (`access.caller_of`: nothing for an open
deployment, an API key's digest looked up, a token's cached review), and the stamp signed
(`access.stamped`). A token's review is made once, by a reviewer function standing in for the API
server, and then read from the cache, as at steady load."""

from __future__ import annotations

import time
from typing import Any

from batchd.api.access import AccessPolicy
from batchd.api.headers import CLIENT_IDENTITY_HEADERS
from batchd.api.manifest import lenient_spec
from batchd.api.stamp import Stamp
from batchd.bench.access.options import WAYS
from batchd.bench.kit.repeats import interleaved
from batchd.router.access import caller_of, credentials_of, stamped
from batchd.router.directory import DeploymentRef
from batchd.router.token_reviews import Review, TokenReviews
from batchd.router.upstream import request_headers
from batchd.testing.kubernetes.routed import access_secret

REF = DeploymentRef("bench", "adder")
PATH = "/v1/models/adder:predict"
KEY = "bench-key-0123456789abcdef0123456789abcdef"
# A token as the API server issues one (a JWT of about 800 bytes), for its parsing and digest.
TOKEN = (
    "eyJhbGciOiJSUzI1NiIsImtpZCI6ImJlbmNoIn0."
    + "eyJhdWQiOlsiYmF0Y2hkIl0sImV4cCI6NDEwMjQ0NDgwMCwic3ViIjoic3lzdGVtOnNlcnZpY2VhY2NvdW50"
    + "OmJlbmNoOmNhbGxlciJ9."
    + "s" * 640
)
BASE_HEADERS = [
    (b"host", b"router:8080"),
    (b"content-type", b"application/json"),
    (b"content-length", b"18"),
    (b"user-agent", b"bench"),
]


def _policy(access: dict[str, Any] | None) -> AccessPolicy:
    spec: dict[str, Any] = {"model": {"handler": "x:y"}}
    if access is not None:
        spec["access"] = access
    return AccessPolicy.of(lenient_spec(spec))


async def _reviewed(token: bytes, ref: DeploymentRef) -> Review:
    return Review("bench/caller", True)


async def _per_request_us(way: str, iterations: int) -> float:
    policy = _policy(
        None
        if way == "off"
        else {
            "tenants": [
                {"name": "keyed", "api_keys_secret": "keyed-keys"},
                {"name": "robots", "service_accounts": ["bench/caller"]},
            ]
        }
    )
    credentials = credentials_of(access_secret(REF.name, REF.namespace, {"keyed": [KEY]}))
    reviews = TokenReviews(_reviewed)
    credential = {
        "off": [],
        "key": [(b"x-api-key", KEY.encode())],
        "token": [(b"authorization", f"Bearer {TOKEN}".encode())],
    }
    headers = BASE_HEADERS + credential[way]
    key = credentials.signing_key
    await caller_of(policy, REF, headers, credentials, reviews)  # the token's one review
    started = time.process_time()
    for _ in range(iterations):
        request_headers(headers, CLIENT_IDENTITY_HEADERS)
        caller = await caller_of(policy, REF, headers, credentials, reviews)
        stamped(key, "POST", PATH, Stamp(caller.tenant.name, "default", "", caller.called_by))
    return (time.process_time() - started) / iterations * 1e6


async def decision_cost(iterations: int, rounds: int) -> dict[str, list[float]]:
    """Each way's CPU per request (us), one value per round; the ways interleaved in each round."""
    found: dict[str, list[float]] = {way: [] for way in WAYS}
    for _, way in interleaved(list(WAYS), rounds):
        found[way].append(await _per_request_us(way, iterations))
    return found
