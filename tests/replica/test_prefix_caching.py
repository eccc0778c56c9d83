"""The prefix cache as a client sees it, through the real `openai` client against a replica on real
uvicorn (a tiny GPT-2 built here): a repeated prompt and the next turn of a chat answer the same
text and say how much of the prompt was cached (`usage.prompt_tokens_details.cached_tokens`);
tenants, as batchd's router stamps them, never hit each other's blocks, whatever the body or the
fairness id says, unless the deployment lets them share; and the metrics count it all.
"""

from __future__ import annotations

import itertools
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from batchd.api.headers import TENANT_HEADER
from batchd.api.manifest import parse_manifest
from batchd.api.stamp import Stamp, signed_headers
from batchd.replica.front.app import create_app
from batchd.replica.settings import ReplicaSettings
from batchd.testing import manifests
from batchd.testing.models import GPT2_CHAT_TEMPLATE, GPT2_CORPUS, build_gpt2
from batchd.testing.servers import uvicorn_in_thread

pytestmark = pytest.mark.slow

BLOCK = 16  # tokens a block of the prefix cache holds
NEW_TOKENS = 8
SYSTEM = " ".join(GPT2_CORPUS[:3])  # a system prompt of several blocks
MEMORY_REQUEST = 2 << 30  # the pod's memory request: 2 GiB
TENANTS = ("alice", "bob", "repeat", "chat", "metrics")
KEY = secrets.token_bytes(32)  # the deployment's signing key, as the operator makes one


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory: Path = build_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))
    return directory


def serve(gpt2_dir: Path, key: Path, **generation: Any) -> Any:
    model = {
        "task": "text-generation",
        "source": f"file://{gpt2_dir}",
        "device": "cpu",
        # Greedy, and every answer as long as it asks: the same prompt, the same text.
        "call_kwargs": {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "do_sample": False},
        "generation": {"chat_template": GPT2_CHAT_TEMPLATE, **generation},
    }
    document = manifests.manifest(
        "gpt2",
        model,
        batching={"max_batch_size": 4, "request_timeout_s": 60},
        resources={"requests": {"memory": "2Gi"}},
        access={"tenants": [{"name": tenant} for tenant in TENANTS]},
    )
    settings = ReplicaSettings(signing_key_file=key)
    return uvicorn_in_thread(create_app(parse_manifest(document), settings))


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("access") / "signing-key"
    path.write_bytes(KEY)
    return path


@pytest.fixture(scope="module")
def replica(gpt2_dir: Path, key: Path) -> Iterator[str]:
    with serve(gpt2_dir, key) as url:
        yield url


@pytest.fixture(scope="module")
def shared(gpt2_dir: Path, key: Path) -> Iterator[str]:
    """The same model, its tenants sharing one cache (`prefix_cache_scope: deployment`)."""
    with serve(gpt2_dir, key, prefix_cache_scope="deployment") as url:
        yield url


def client(url: str, tenant: str, caller: str = "", *, forged: dict[str, str] | None = None) -> openai.OpenAI:
    """The `openai` client as batchd's router forwards it: each request stamped as `tenant`'s
    `caller` (its fairness id) with the deployment's key, plus `forged` headers of the client's."""

    def stamp(request: Any) -> None:  # an httpx Request, of the httpx the openai client runs on
        target = request.url.raw_path.decode()
        for name, value in signed_headers(KEY, request.method, target, Stamp(tenant, "", caller)):
            request.headers[name.decode()] = value.decode()
        request.headers.update(forged or {})

    return openai.OpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=60,
        http_client=openai.DefaultHttpxClient(event_hooks={"request": [stamp]}, timeout=60),
    )


def cached(usage: Any) -> int:
    assert usage is not None and usage.prompt_tokens_details is not None
    return int(usage.prompt_tokens_details.cached_tokens)


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    found = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} is not exported"
    return float(found.group(1))


def complete(api: openai.OpenAI, prompt: str, **extra: Any) -> tuple[str, int, int]:
    """The text, the prompt's tokens and its cached tokens of one completion."""
    answer = api.completions.create(model="gpt2", prompt=prompt, temperature=0, **extra)
    assert answer.usage is not None
    return answer.choices[0].text, answer.usage.prompt_tokens, cached(answer.usage)


def test_a_repeated_prompt_is_answered_the_same_from_its_cached_blocks(replica: str) -> None:
    with client(replica, "repeat") as api:
        prompt = f"{SYSTEM} Question one?"
        text, tokens, first = complete(api, prompt)
        again, _, second = complete(api, prompt)
        assert first == 0
        assert tokens > 2 * BLOCK and second == (tokens - 1) // BLOCK * BLOCK
        assert again == text
        stream = api.completions.create(
            model="gpt2", prompt=prompt, temperature=0, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert cached(chunks[-1].usage) == second


def test_the_next_turn_of_a_chat_hits_the_conversation_so_far(replica: str) -> None:
    with client(replica, "chat") as api:
        messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello?"}]
        turns = []
        for question in ("And then?", "Why?", "Thanks."):
            answer = api.chat.completions.create(model="gpt2", messages=messages, temperature=0)
            assert answer.usage is not None
            turns.append((answer.usage.prompt_tokens, cached(answer.usage)))
            messages += [
                {"role": "assistant", "content": answer.choices[0].message.content},
                {"role": "user", "content": question},
            ]
    assert turns[0][1] == 0
    for (earlier_prompt, _), (_, hit) in itertools.pairwise(turns):
        # At least every whole block of the turn before, which the rendered history begins with.
        assert hit >= earlier_prompt // BLOCK * BLOCK > 0


def test_tenants_never_hit_each_others_blocks_whatever_they_claim(replica: str) -> None:
    prompt = f"{SYSTEM} Who asked this?"
    with client(replica, "alice", "a") as alice:
        text, _, first = complete(alice, prompt)
        assert first == 0
        assert complete(alice, prompt)[2] > 0  # the positive control: Alice's own blocks
    # Bob names Alice's caller as his fairness id, or in the body (OpenAI's `user`): only the
    # tenant the router stamped says whose blocks are his.
    with client(replica, "bob", "a") as bob:
        as_bob, _, bobs = complete(bob, prompt, user="a")
        assert bobs == 0 and as_bob == text
    # Bob writes Alice's tenant into the stamped header himself: the stamp no longer checks.
    forged = {TENANT_HEADER.decode(): "alice"}
    with (
        client(replica, "bob", forged=forged) as forger,
        pytest.raises(openai.AuthenticationError) as refused,
    ):
        complete(forger, prompt)
    assert "not signed with this deployment's key" in str(refused.value)
    with client(replica, "bob") as bob:
        assert complete(bob, prompt)[2] > 0, "Bob's own blocks"


def test_a_deployment_that_shares_its_cache_lets_every_caller_hit(shared: str) -> None:
    prompt = f"{SYSTEM} Shared by all?"
    with client(shared, "alice") as alice, client(shared, "bob") as bob:
        text, tokens, first = complete(alice, prompt)
        as_bob, _, bobs = complete(bob, prompt)
    assert first == 0 and bobs == (tokens - 1) // BLOCK * BLOCK and as_bob == text


def test_the_metrics_count_what_the_cache_did_within_a_bound_from_the_memory_request(replica: str) -> None:
    with client(replica, "metrics") as api:
        prompt = f"{SYSTEM} Counted?"
        complete(api, prompt)
        _, tokens, hit = complete(api, prompt)
    queried = metric(replica, "batchd_prefix_cache_queried_tokens_total")
    hits = metric(replica, "batchd_prefix_cache_hit_tokens_total")
    assert queried >= 2 * tokens and hits >= hit > 0 and hits < queried
    capacity = metric(replica, "batchd_prefix_cache_capacity_bytes")
    held = metric(replica, "batchd_prefix_cache_bytes")
    # Half of what 2 GiB leave after the process and the running sequences' cache.
    assert 0 < held <= capacity < MEMORY_REQUEST / 2
    assert metric(replica, "batchd_prefix_cache_evicted_blocks_total") == 0
