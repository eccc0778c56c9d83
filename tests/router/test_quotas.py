"""Quotas per tenant: a token bucket of requests a second, tokens a minute charged after the
answer, each router at its share of the quota by the routers' count, and the 429's headers."""

from __future__ import annotations

import pytest

from batchd.api.access import Tenant
from batchd.router.directory import DeploymentRef
from batchd.router.peers import Peers
from batchd.router.quotas import QuotaExceeded, Quotas, tokens_used

REF = DeploymentRef("ml", "adder")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tenant(requests_per_s: float | None = None, tokens_per_minute: int | None = None) -> Tenant:
    return Tenant("team-a", frozenset({"default"}), "default", 10, requests_per_s, tokens_per_minute)


def admitted(quotas: Quotas, who: Tenant, count: int) -> int:
    served = 0
    for _ in range(count):
        try:
            quotas.admit(REF, who)
        except QuotaExceeded:
            continue
        served += 1
    return served


def test_a_tenant_at_three_times_its_rate_is_served_its_quota() -> None:
    clock = Clock()
    quotas = Quotas(clock=clock)
    fast, other = tenant(requests_per_s=10), Tenant("team-b", None, "default", 10, 10.0)
    served = 0
    for _ in range(100):  # 10 s at 30 requests a second
        served += admitted(quotas, fast, 3)
        assert admitted(quotas, other, 1) == 1  # another tenant at its own rate: never refused
        clock.now += 0.1
    assert 100 <= served <= 110  # its quota, and the one second's burst it starts with


def test_the_429_says_when_to_come_back_in_openais_headers() -> None:
    quotas = Quotas(clock=Clock())
    who = tenant(requests_per_s=2)
    assert admitted(quotas, who, 2) == 2
    with pytest.raises(QuotaExceeded) as refused:
        quotas.admit(REF, who)
    headers = dict(refused.value.headers)
    assert headers[b"retry-after"] == b"1"
    assert headers[b"x-ratelimit-limit-requests"] == b"2"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"
    assert headers[b"x-ratelimit-reset-requests"] == b"1.000s"
    assert refused.value.reason == "requests_per_s" and refused.value.tenant == "team-a"


def test_each_router_admits_its_share_so_two_admit_the_quota_in_all() -> None:
    clock = Clock()
    first, second = Quotas(lambda: 2, clock), Quotas(lambda: 2, clock)
    who = tenant(requests_per_s=10)
    served = 0
    for _ in range(100):
        served += admitted(first, who, 3) + admitted(second, who, 3)
        clock.now += 0.1
    assert 100 <= served <= 110


def test_tokens_are_charged_after_the_answer_and_a_debt_refuses_until_paid() -> None:
    clock = Clock()
    quotas = Quotas(clock=clock)
    who = tenant(tokens_per_minute=600)  # 10 a second
    quotas.admit(REF, who)
    quotas.charge(REF, who, tokens_used(b'{"usage": {"prompt_tokens": 500, "completion_tokens": 400}}'))
    with pytest.raises(QuotaExceeded) as refused:
        quotas.admit(REF, who)
    headers = dict(refused.value.headers)
    assert headers[b"retry-after"] == b"30"  # 300 tokens of debt at 10 a second
    assert headers[b"x-ratelimit-limit-tokens"] == b"600"
    assert refused.value.reason == "tokens_per_minute"
    clock.now += 31
    quotas.admit(REF, who)


def test_the_tokens_an_answer_reports() -> None:
    assert tokens_used(b'{"usage": {"total_tokens": 7, "prompt_tokens": 3}}') == 7
    assert tokens_used(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4}}') == 7
    assert tokens_used(b'{"predictions": [1]}') == 0
    assert tokens_used(b"not json") == 0


def test_the_routers_are_counted_by_their_services_ready_endpoints() -> None:
    peers = Peers()
    assert peers.count() == 1  # none seen yet: this one
    endpoints = [
        {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
        {"addresses": ["10.0.0.2"]},
        {"addresses": ["10.0.0.3"], "conditions": {"ready": False}},
    ]
    peers.replace([{"metadata": {"name": "router-a"}, "endpoints": endpoints}], "batchd")
    assert peers.count() == 2
    peers.delete({"metadata": {"name": "router-a"}})
    assert peers.count() == 1
