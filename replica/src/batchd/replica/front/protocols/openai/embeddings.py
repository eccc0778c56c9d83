"""`POST /v1/embeddings`: each input one batch item, batched with every other route's items.

Inputs given as token ids are decoded to text and embedded like any text. `usage` counts each
input's tokens as the model reads them (special tokens in, truncated at the model's
`max_seq_length`), with a tokenizer of the route's own, loaded at its first request: the model's
runs in the batch thread, and a Rust tokenizer refuses two threads at once.
"""

from __future__ import annotations

import asyncio
import base64
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from batchd.replica.errors import InvalidInput, UnknownModel
from batchd.replica.front.endpoints import Call
from batchd.replica.front.protocols.openai.models import check_model
from batchd.replica.front.protocols.openai.requests import read_embedding, who_asks
from batchd.replica.replica import Replica

EMBEDDING_TASK = "feature-extraction"

_TOKENIZERS: weakref.WeakKeyDictionary[Replica, asyncio.Future[Any]] = weakref.WeakKeyDictionary()


async def embeddings(call: Call) -> dict[str, Any]:
    body = call.json()
    ask = read_embedding(body)
    call.client = call.client.asking(*who_asks(body))
    replica = call.replica
    check_model(replica, ask.model)
    if replica.manifest.spec.model.task != EMBEDDING_TASK:
        raise UnknownModel(
            f"model: {ask.model!r} does not embed text: /v1/embeddings serves task {EMBEDDING_TASK}"
        )
    native = _dimensions(replica)  # None while the model loads (the batcher then answers 503)
    if ask.dimensions is not None and native is not None and ask.dimensions != native:
        raise InvalidInput(
            f"dimensions: this model gives {native}-dimensional embeddings only, got {ask.dimensions}"
        )
    tokenizer, max_tokens = await _tokenizer(replica)
    texts = [
        item if isinstance(item, str) else str(tokenizer.decode(list(item), skip_special_tokens=True))
        for item in ask.inputs
    ]
    vectors = await call.infer(texts, "input")
    counted = [i for i, item in enumerate(ask.inputs) if isinstance(item, str)]
    lengths = [min(len(item), max_tokens) for item in ask.inputs if not isinstance(item, str)]
    if counted:
        ids = tokenizer([texts[i] for i in counted], truncation=True, max_length=max_tokens)["input_ids"]
        lengths += [len(tokens) for tokens in ids]
    data = [
        {"object": "embedding", "index": index, "embedding": _base64(vector) if ask.base64 else vector}
        for index, vector in enumerate(vectors)
    ]
    tokens = sum(lengths)
    return {
        "object": "list",
        "data": data,
        "model": ask.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _base64(vector: list[float]) -> str:
    """OpenAI's `base64` encoding: the vector's little-endian float32 bytes."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def _dimensions(replica: Replica) -> int | None:
    outputs = replica.output_specs
    return outputs[0].shape[-1] if outputs and outputs[0].shape[-1] > 0 else None


async def _tokenizer(replica: Replica) -> tuple[Any, int]:
    loading = _TOKENIZERS.get(replica)
    if loading is None or (
        loading.done() and loading.exception() is not None
    ):  # the next request tries again
        loading = asyncio.ensure_future(asyncio.to_thread(_load_tokenizer, replica))
        _TOKENIZERS[replica] = loading
    result: tuple[Any, int] = await asyncio.shield(loading)
    return result


def _load_tokenizer(replica: Replica) -> tuple[Any, int]:
    """The model's tokenizer and how many tokens of an input the model reads, as the model's
    pipeline reads it (`models.pipelines`)."""
    from transformers import AutoTokenizer

    from batchd.replica.models.pipelines import sentence_transformers_config
    from batchd.replica.models.sources import resolve_source

    spec, settings = replica.manifest.spec.model, replica.settings
    assert spec.source is not None  # a task always has one
    location = resolve_source(spec.source, mirror_dir=settings.model_mirror, pvc_root=settings.pvc_root)
    tokenizer = AutoTokenizer.from_pretrained(location)
    _, _, limit = sentence_transformers_config(Path(location), int(tokenizer.model_max_length))
    return tokenizer, limit
