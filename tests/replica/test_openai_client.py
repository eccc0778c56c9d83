"""The OpenAI API, through the real `openai` client, against replicas on a real uvicorn: a tiny
GPT-2 built here for completions and chat (token-level scheduling), the bundled MiniLM for
embeddings.

The tiny model's weights are random, so its text means nothing, but greedy text is repeatable:
answers are compared with each other (a stop string cuts the same text where it starts, n
choices come back as n), and every sequence runs to its max_tokens (the spec holds end-of-sequence back
until then).
"""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from pydantic import SecretStr

from batchd.api.manifest import parse_manifest
from batchd.replica.front.app import create_app
from batchd.replica.settings import ReplicaSettings
from batchd.testing import manifests
from batchd.testing.models import GPT2_CHAT_TEMPLATE, MINILM_SOURCE, build_gpt2, minilm_mirror, minilm_path
from batchd.testing.servers import uvicorn_in_thread, wait_until

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time"
LONG = 120  # new tokens of a long answer
ENDLESS = 2000  # new tokens of an answer that outlasts any test: one that leaves, or fills a row
SENTENCES = ["A man is eating food.", "The stock market fell sharply today."]


_CLIENTS: dict[str, openai.OpenAI] = {}


def client(url: str) -> openai.OpenAI:
    """The openai client for the replica at `url` (one each, closed after the module's tests)."""
    if url not in _CLIENTS:
        _CLIENTS[url] = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    return _CLIENTS[url]


@pytest.fixture(scope="module", autouse=True)
def closed_clients() -> Iterator[None]:
    yield
    for api in _CLIENTS.values():
        api.close()
    _CLIENTS.clear()


def metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(f"{url}/metrics").text
    found = re.search(rf"^{name}{{[^}}]*{labels}[^}}]*}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory: Path = build_gpt2(tmp_path_factory.mktemp("tiny-gpt2"), n_positions=ENDLESS + 64)
    return directory


@pytest.fixture(scope="module")
def gpt2(gpt2_dir: Path) -> Iterator[str]:
    directory = gpt2_dir
    model = {
        "task": "text-generation",
        "source": f"file://{directory}",
        "device": "cpu",
        "served_model_name": "tiny/gpt2",
        # End-of-sequence held back until max_tokens: every answer has the length it asks for.
        "call_kwargs": {"max_new_tokens": ENDLESS, "min_new_tokens": ENDLESS},
        "generation": {"max_new_tokens": ENDLESS, "chat_template": GPT2_CHAT_TEMPLATE},
    }
    batching = {"max_batch_size": 4, "max_queued_requests": 8, "request_timeout_s": 60}
    document = manifests.manifest("gpt2", model, batching=batching)
    with uvicorn_in_thread(create_app(parse_manifest(document), ReplicaSettings())) as url:
        yield url


@pytest.fixture(scope="module")
def gpt2_by_request(gpt2_dir: Path) -> Iterator[str]:
    """The same model, served by request-level batches through the transformers pipeline."""
    model = {
        "task": "text-generation",
        "source": f"file://{gpt2_dir}",
        "device": "cpu",
        "generation": {"scheduling": "request", "chat_template": GPT2_CHAT_TEMPLATE},
    }
    document = manifests.manifest("gpt2", model, batching={"max_batch_size": 4})
    with uvicorn_in_thread(create_app(parse_manifest(document), ReplicaSettings())) as url:
        yield url


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    mirror = minilm_mirror(tmp_path_factory.mktemp("mirror"))
    model = {"task": "feature-extraction", "source": MINILM_SOURCE, "device": "cpu"}
    document = manifests.manifest("minilm", model, batching={"max_batch_size": 16})
    settings = ReplicaSettings(model_mirror=mirror)
    with uvicorn_in_thread(create_app(parse_manifest(document), settings)) as url:
        yield url


def test_completions_whole_and_streamed_are_the_same_text(gpt2: str) -> None:
    api = client(gpt2)
    whole = api.completions.create(model="tiny/gpt2", prompt=PROMPT, max_tokens=LONG, temperature=0)
    (choice,) = whole.choices
    assert choice.finish_reason == "length" and whole.object == "text_completion"
    assert whole.usage is not None and whole.usage.completion_tokens == LONG
    assert whole.usage.prompt_tokens > 0 and whole.model == "tiny/gpt2"
    chunks = list(
        api.completions.create(
            model="tiny/gpt2",
            prompt=PROMPT,
            max_tokens=LONG,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert len(chunks) > 2, "the answer came in one piece, not streamed"
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_a_stop_string_cuts_the_text_where_it_starts(gpt2: str) -> None:
    api = client(gpt2)
    text = (
        api.completions.create(model="tiny/gpt2", prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    )
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = text[: text.index(stop)]
    choice = api.completions.create(
        model="tiny/gpt2", prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop]
    ).choices[0]
    assert (choice.text, choice.finish_reason) == (cut, "stop")
    streamed = api.completions.create(
        model="tiny/gpt2", prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == cut


def test_chat_through_the_spec_template_whole_and_streamed(gpt2: str) -> None:
    api = client(gpt2)
    messages: Any = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    whole = api.chat.completions.create(
        model="tiny/gpt2", messages=messages, max_completion_tokens=20, temperature=0
    )
    (choice,) = whole.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 20
    # The template's own text is the prompt: "system: ...\nuser: ...\nassistant:"
    completion = api.completions.create(
        model="tiny/gpt2",
        prompt=f"system: Be brief.\nuser: {PROMPT}\nassistant:",
        max_tokens=20,
        temperature=0,
    )
    assert choice.message.content == completion.choices[0].text
    chunks = list(
        api.chat.completions.create(
            model="tiny/gpt2", messages=messages, max_tokens=20, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content


def test_n_choices_sampled_with_a_seed_are_repeatable(gpt2: str) -> None:
    api = client(gpt2)
    ask: Any = {
        "model": "tiny/gpt2",
        "prompt": PROMPT,
        "max_tokens": 8,
        "temperature": 1.0,
        "n": 3,
        "seed": 7,
    }
    first = api.completions.create(**ask)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert first.usage is not None and first.usage.completion_tokens == 3 * 8
    assert [c.text for c in api.completions.create(**ask).choices] == [c.text for c in first.choices]
    streamed: dict[int, str] = {}
    for chunk in api.completions.create(**ask, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {c.index: c.text for c in first.choices}


@pytest.mark.parametrize(
    ("ask", "param"),
    [
        ({"prompt": PROMPT, "logit_bias": {"5": 10}}, "logit_bias"),
        ({"prompt": PROMPT, "presence_penalty": 0.5}, "presence_penalty"),
        ({"prompt": PROMPT, "max_tokens": ENDLESS + 1}, "max_tokens"),
        ({"prompt": PROMPT, "temperature": 3}, "temperature"),
        ({"prompt": PROMPT, "n": 0}, "n"),
        ({"prompt": PROMPT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": PROMPT, "best_of": 3}, "best_of"),
        ({"prompt": [PROMPT, 5]}, "prompt[1]"),
        ({"prompt": PROMPT, "stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_bad_completion_parameters_are_refused_by_name(gpt2: str, ask: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client(gpt2).completions.create(model="tiny/gpt2", **ask)
    assert refused.value.status_code == 400
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(param), error


def test_bad_chat_parameters_are_refused_by_name(gpt2: str) -> None:
    api = client(gpt2)
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(model="tiny/gpt2", messages=[{"role": "user", "content": "hi"}], tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ])  # fmt: skip
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "tools"
    image: Any = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(model="tiny/gpt2", messages=image)
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "messages[0].content[0]"
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(
            model="tiny/gpt2", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=ENDLESS + 1
        )
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "max_completion_tokens"
    with pytest.raises(openai.NotFoundError) as unknown:
        api.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert isinstance(unknown.value.body, dict) and unknown.value.body["param"] == "model"


def test_a_client_that_leaves_mid_stream_frees_its_row(gpt2: str) -> None:
    cancelled = metric(gpt2, "batchd_requests_total", 'outcome="cancelled"')
    stream = client(gpt2).completions.create(
        model="tiny/gpt2", prompt=PROMPT, max_tokens=ENDLESS, temperature=0, stream=True
    )
    next(iter(stream))
    assert metric(gpt2, "batchd_running_sequences") == 1
    stream.close()
    wait_until(lambda: metric(gpt2, "batchd_running_sequences") == 0, 30, "the row freed")
    wait_until(
        lambda: metric(gpt2, "batchd_requests_total", 'outcome="cancelled"') == cancelled + 1,
        30,
        "the request counted as cancelled",
    )


def test_models_lists_the_served_name_for_openai_and_kserve_alike(gpt2: str) -> None:
    api = client(gpt2)
    assert [m.id for m in api.models.list()] == ["tiny/gpt2"]
    assert api.models.retrieve("gpt2").id == "tiny/gpt2"
    listing = httpx.get(f"{gpt2}/v1/models").json()
    assert listing["models"] == ["gpt2"]  # KServe V1's listing, in the same answer
    assert httpx.get(f"{gpt2}/v1/models/gpt2").json()["ready"] is True


def test_embeddings_as_floats_base64_and_token_ids(minilm: str) -> None:
    api = client(minilm)
    floats = api.embeddings.create(model="minilm", input=SENTENCES, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1] and len(floats.data[0].embedding) == 384
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(SENTENCES) * 4
    packed = api.embeddings.create(model="minilm", input=SENTENCES)  # the client asks for base64
    assert np.allclose(packed.data[1].embedding, floats.data[1].embedding, atol=1e-6)
    raw = httpx.post(
        f"{minilm}/v1/embeddings",
        json={"model": "minilm", "input": SENTENCES[0], "encoding_format": "base64"},
    ).json()
    vector = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(vector, floats.data[0].embedding, atol=1e-6)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    ids = tokenizer(SENTENCES[0], add_special_tokens=False)["input_ids"]
    by_ids = api.embeddings.create(model="minilm", input=[ids], encoding_format="float")
    assert np.allclose(by_ids.data[0].embedding, floats.data[0].embedding, atol=1e-4)


def test_bad_embedding_parameters_are_refused_by_name(minilm: str) -> None:
    api = client(minilm)
    with pytest.raises(openai.BadRequestError) as refused:
        api.embeddings.create(model="minilm", input="hi", dimensions=128)
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "dimensions"
    assert api.embeddings.create(model="minilm", input="hi", dimensions=384).data
    with pytest.raises(openai.BadRequestError) as refused:
        api.embeddings.create(model="minilm", input=[])
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "input"
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="minilm", prompt="hi")


def test_langchain_chat_and_embeddings(gpt2: str, minilm: str) -> None:
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    with httpx.Client(timeout=60) as http:
        chat = ChatOpenAI(
            base_url=f"{gpt2}/v1",
            api_key=SecretStr("unused"),
            model="tiny/gpt2",
            max_completion_tokens=8,
            temperature=0,
            http_client=http,
        )
        answer = chat.invoke("Once upon a time")
        assert isinstance(answer.content, str) and answer.response_metadata["finish_reason"] == "length"
        assert "".join(str(chunk.content) for chunk in chat.stream("Once upon a time")) == answer.content
        # check_embedding_ctx_length would count tokens with tiktoken, which downloads its tables.
        embedder = OpenAIEmbeddings(
            base_url=f"{minilm}/v1",
            api_key=SecretStr("unused"),
            model="minilm",
            check_embedding_ctx_length=False,
            http_client=http,
        )
        vectors = embedder.embed_documents(SENTENCES)
        assert len(vectors) == 2 and len(vectors[0]) == 384
        assert np.allclose(embedder.embed_query(SENTENCES[0]), vectors[0], atol=1e-6)


def test_logprobs_of_the_chosen_tokens_and_their_alternatives(gpt2: str) -> None:
    api = client(gpt2)
    messages: Any = [{"role": "user", "content": PROMPT}]
    chat = api.chat.completions.create(
        model="tiny/gpt2", messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)  # greedy: the likeliest
    assert "".join(entry.token for entry in content) == chat.choices[0].message.content
    completion = api.completions.create(
        model="tiny/gpt2", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2
    )
    scores = completion.choices[0].logprobs
    assert scores is not None and scores.token_logprobs is not None and scores.text_offset is not None
    assert len(scores.token_logprobs) == 6 and scores.text_offset[0] == 0
    streamed = [
        entry
        for chunk in api.chat.completions.create(
            model="tiny/gpt2", messages=messages, max_tokens=6, temperature=0, logprobs=True, stream=True
        )
        for entry in (chunk.choices[0].logprobs.content or [] if chunk.choices[0].logprobs else [])
    ]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)


def test_the_callers_deadline_bounds_a_completion(gpt2: str) -> None:
    with pytest.raises(openai.InternalServerError) as late:
        client(gpt2).completions.create(
            model="tiny/gpt2",
            prompt=PROMPT,
            max_tokens=ENDLESS,
            temperature=0,
            extra_headers={"batchd-timeout-s": "0.001"},
        )
    assert late.value.status_code == 504
    assert isinstance(late.value.body, dict) and late.value.body["type"] == "timeout_error"


async def test_a_deployment_handle_embeds_through_the_callees_openai_route(minilm: str) -> None:
    from batchd.replica.handles import CallClient, DeploymentHandle

    calls = CallClient()
    try:
        handle = DeploymentHandle("embedder", "minilm", minilm, calls)
        vectors = await handle.embed(SENTENCES)
        assert await handle.embed([]) == []
    finally:
        await calls.aclose()
    expected = client(minilm).embeddings.create(model="minilm", input=SENTENCES, encoding_format="float")
    assert np.allclose(vectors, [d.embedding for d in expected.data], atol=1e-6)


def test_request_level_scheduling_answers_the_same_routes(gpt2_by_request: str) -> None:
    api = client(gpt2_by_request)
    messages: Any = [{"role": "user", "content": PROMPT}]
    whole = api.chat.completions.create(model="gpt2", messages=messages, max_tokens=6, temperature=0, n=2)
    assert [c.index for c in whole.choices] == [0, 1] and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.choices[0].message.content == whole.choices[1].message.content  # greedy, twice
    streamed = api.chat.completions.create(
        model="gpt2", messages=messages, max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == whole.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(model="gpt2", prompt=PROMPT, logprobs=1)
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "logprobs"


@pytest.fixture(scope="module")
def gpt2_one_row(gpt2_dir: Path) -> Iterator[str]:
    """One row and one place in the queue: a third request finds the replica full."""
    model = {
        "task": "text-generation",
        "source": f"file://{gpt2_dir}",
        "device": "cpu",
        "call_kwargs": {"max_new_tokens": ENDLESS, "min_new_tokens": ENDLESS},
        "generation": {"max_new_tokens": ENDLESS},
    }
    batching = {"max_batch_size": 1, "max_queued_requests": 1, "request_timeout_s": 60}
    document = manifests.manifest("gpt2", model, batching=batching)
    with uvicorn_in_thread(create_app(parse_manifest(document), ReplicaSettings())) as url:
        yield url


def test_a_full_replica_answers_503_with_retry_after_which_the_client_retries(gpt2_one_row: str) -> None:
    url = gpt2_one_row
    running = client(url).completions.create(
        model="gpt2", prompt=PROMPT, max_tokens=ENDLESS, temperature=0, stream=True
    )
    next(iter(running))  # the one row is taken
    queued = threading.Thread(
        target=lambda: client(url).completions.create(model="gpt2", prompt=PROMPT, max_tokens=8),
        daemon=True,
    )
    queued.start()
    wait_until(lambda: metric(url, "batchd_waiting_sequences") == 1, 30, "a request queued")
    rejected = metric(url, "batchd_requests_total", 'outcome="rejected"')
    retrying = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=1, timeout=60)
    try:
        with pytest.raises(openai.InternalServerError) as full:
            retrying.completions.create(model="gpt2", prompt=PROMPT, max_tokens=8)
    finally:
        retrying.close()
    assert full.value.status_code == 503
    assert int(full.value.response.headers["retry-after"]) >= 1
    assert isinstance(full.value.body, dict)
    assert (full.value.body["type"], full.value.body["code"]) == ("service_unavailable_error", "queue_full")
    # The client's built-in retry came back after Retry-After, and was refused again: two refusals.
    assert metric(url, "batchd_requests_total", 'outcome="rejected"') == rejected + 2
    running.close()
    queued.join(timeout=60)
    assert not queued.is_alive()  # the queued request got the row once the stream let it go
