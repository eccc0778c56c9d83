"""The token reviews' cache and single flight, with a reviewer function standing in for the API
server (the real TokenReview and SubjectAccessReview are the end-to-end suite's): one review per
token and deployment per TTL, a refusal remembered briefly, none past the token's expiry, and
identical reviews at once made once."""

from __future__ import annotations

import asyncio
import base64

import orjson
import pytest

from batchd.router.access import Forbidden, Unauthenticated
from batchd.router.directory import DeploymentRef
from batchd.router.token_reviews import Review as Found
from batchd.router.token_reviews import TokenReviews, expiry_of

REF = DeploymentRef("ml", "adder")


def token(exp: float | None = None, subject: str = "x") -> bytes:
    def part(document: dict[str, object]) -> bytes:
        return base64.urlsafe_b64encode(orjson.dumps(document)).rstrip(b"=")

    claims: dict[str, object] = {"sub": subject} if exp is None else {"sub": subject, "exp": exp}
    return b".".join((part({"alg": "RS256"}), part(claims), b"c2ln"))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Reviewer:
    """Answers `review` for every token, after `gate` is set (so that reviews overlap)."""

    def __init__(self, review: Found) -> None:
        self.review = review
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, token: bytes, ref: DeploymentRef) -> Found:
        self.calls += 1
        await self.gate.wait()
        return self.review


def test_a_tokens_expiry_is_read_from_its_payload() -> None:
    assert expiry_of(token(1234.0)) == 1234.0
    assert expiry_of(token()) is None
    assert expiry_of(b"not-a-token") is None


async def test_an_allowed_review_is_kept_five_minutes_and_never_past_the_tokens_expiry() -> None:
    clock = Clock()
    reviewer = Reviewer(Found("ml/composer", True))
    reviews = TokenReviews(reviewer, clock=clock)
    long_lived, short_lived = token(clock.now + 3600, "a"), token(clock.now + 60, "b")
    for _ in range(3):
        assert await reviews.account(long_lived, REF) == "ml/composer"
        assert await reviews.account(short_lived, REF) == "ml/composer"
    assert reviewer.calls == 2
    clock.now += 61  # the short-lived token expired: asked again
    await reviews.account(long_lived, REF)
    await reviews.account(short_lived, REF)
    assert reviewer.calls == 3
    clock.now += 300  # five minutes after the first review: asked again
    await reviews.account(long_lived, REF)
    assert reviewer.calls == 4
    await reviews.account(long_lived, DeploymentRef("ml", "other"))  # another deployment: its own grant
    assert reviewer.calls == 5


async def test_a_refusal_is_kept_ten_seconds() -> None:
    clock = Clock()
    denied = Reviewer(Found("ml/composer", False, "RBAC grants no invoke"))
    reviews = TokenReviews(denied, clock=clock)
    for _ in range(3):
        with pytest.raises(Forbidden):
            await reviews.account(token(), REF)
    assert denied.calls == 1
    clock.now += 10.5
    with pytest.raises(Forbidden):
        await reviews.account(token(), REF)
    assert denied.calls == 2
    bad = TokenReviews(Reviewer(Found(None, False, "not a token of the audience batchd")), clock=clock)
    with pytest.raises(Unauthenticated) as refused:
        await bad.account(token(), REF)
    assert refused.value.reason == "token_refused" and "audience" in str(refused.value)


async def test_identical_reviews_at_once_are_one() -> None:
    reviewer = Reviewer(Found("ml/composer", True))
    reviewer.gate.clear()
    reviews = TokenReviews(reviewer)
    waiting = [asyncio.ensure_future(reviews.account(token(), REF)) for _ in range(50)]
    for _ in range(1000):  # until the first has asked the reviewer (each turn runs every ready task)
        if reviewer.calls:
            break
        await asyncio.sleep(0)
    assert reviewer.calls == 1
    waiting[0].cancel()  # a caller that leaves cancels nobody else's review
    reviewer.gate.set()
    answers = await asyncio.gather(*waiting, return_exceptions=True)
    assert isinstance(answers[0], asyncio.CancelledError)
    assert answers[1:] == ["ml/composer"] * 49
    assert reviewer.calls == 1 == reviews.reviews
