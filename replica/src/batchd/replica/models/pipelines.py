"""transformers models by `model.task`, batched: one tokenizer call and one forward pass per batch.

`feature-extraction` is done here rather than through `transformers.pipeline`, with the pooling
sentence-transformers would apply (read from the model's `1_Pooling/config.json` and
`modules.json`): the pipeline returns per-token states, item by item, and pooling them in
Python afterwards is both slower and not what sentence-embedding users expect. The other
tasks use the pipeline with `batch_size` set to the batch. Text generation builds on the same
pipeline in `batchd.replica.generation`, which serves its generate routes too.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, TypeAdapter

from batchd.api.spec import ModelSpec, TensorSpec
from batchd.replica.json_encoding import plain
from batchd.replica.models.base import BatchModel, ModelLoadError, ModelMetadata
from batchd.replica.models.devices import choose_device, choose_dtype
from batchd.replica.models.executor import ModelExecutor

logger = logging.getLogger(__name__)

WARMUP_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Batching amortises the cost of a forward pass.",
)
MAX_WARMUP_BATCH = 32


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("text is empty")
    return value


TEXT = TypeAdapter(Annotated[str, AfterValidator(_text)])


class PipelineModel:
    """A BatchModel around a callable that maps a list of texts to a list of results."""

    def __init__(
        self,
        run: Any,
        executor: ModelExecutor,
        metadata: ModelMetadata,
        item_adapter: TypeAdapter[Any] = TEXT,
        warmup_text: str = WARMUP_TEXTS[0],
    ) -> None:
        self._run = run
        self._executor = executor
        self.metadata = metadata
        self.item_adapter = item_adapter
        self._warmup_text = warmup_text

    async def predict_batch(self, items: list[Any]) -> list[Any]:
        results: list[Any] = await self._executor.run_sync(self._run, items)
        return results

    async def warmup(self, max_batch_size: int) -> None:
        size = max(1, min(max_batch_size, MAX_WARMUP_BATCH))
        await self.predict_batch([self._warmup_text] * size)
        if size > 1:
            await self.predict_batch([self._warmup_text])

    def close(self) -> None:
        self._executor.close()


def load_pipeline(spec: ModelSpec, location: str, executor: ModelExecutor) -> BatchModel:
    """Load `spec.task` from `location` (a directory, or a hub id), on the chosen device and dtype."""
    device, dtype = placement(spec, location)
    with source_errors(spec, location):
        if spec.task == "feature-extraction":
            return _embeddings(location, device, dtype, executor)
        task = open_pipeline(spec, location, device, dtype)
        return PipelineModel(task.run, executor, task.metadata, task.item_adapter, task.warmup_text)


def placement(spec: ModelSpec, location: str) -> tuple[str, Any]:
    """The device and the torch dtype `spec` asks for, on this machine."""
    import torch

    device = choose_device(spec.device, torch.cuda.is_available())
    dtype = getattr(torch, choose_dtype(spec.dtype, device))
    logger.info("loading %s from %s on %s as %s", spec.task, location, device, dtype)
    return device, dtype


@contextmanager
def source_errors(spec: ModelSpec, location: str) -> Iterator[None]:
    """A model that cannot be read from `location` as a ModelLoadError naming `model.source`."""
    try:
        yield
    except OSError as error:
        hint = (
            " (offline? set BATCHD_MODEL_MIRROR to a directory holding org/name)" if "/" in location else ""
        )
        raise ModelLoadError(
            f"model.source: cannot load {spec.source!r} from {location}{hint}: {error}"
        ) from error


def _embeddings(location: str, device: str, dtype: Any, executor: ModelExecutor) -> PipelineModel:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(location)
    model = AutoModel.from_pretrained(location, dtype=dtype).to(device).eval()
    pooling, normalize, max_length = sentence_transformers_config(Path(location), tokenizer.model_max_length)
    # Rust tokenizers refuse concurrent use from several threads ("Already borrowed").
    tokenizer_lock = threading.Lock()

    def embed(texts: list[str]) -> list[list[float]]:
        with tokenizer_lock:
            encoded = tokenizer(
                texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
            )
        encoded = encoded.to(device)
        with torch.inference_mode():
            states = model(**encoded).last_hidden_state
            mask = encoded["attention_mask"].unsqueeze(-1).to(states.dtype)
            if pooling == "cls":
                vectors = states[:, 0]
            elif pooling == "max":
                vectors = states.masked_fill(mask == 0, torch.finfo(states.dtype).min).max(dim=1).values
            else:
                vectors = (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            if normalize:
                vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
            result: list[list[float]] = vectors.float().cpu().tolist()
            return result

    dimension = int(model.config.hidden_size)
    metadata = ModelMetadata(
        platform="transformers/feature-extraction",
        inputs=(TensorSpec(name="text", datatype="BYTES"),),
        outputs=(TensorSpec(name="embedding", datatype="FP32", shape=(-1, dimension)),),
    )
    return PipelineModel(embed, executor, metadata)


def sentence_transformers_config(directory: Path, model_max_length: int) -> tuple[str, bool, int]:
    """Pooling mode, L2 normalisation and max sequence length, read as sentence-transformers does."""
    pooling, normalize, max_length = "mean", False, min(model_max_length, 512)
    pooling_file = directory / "1_Pooling" / "config.json"
    if pooling_file.is_file():
        config = json.loads(pooling_file.read_text())
        if config.get("pooling_mode_cls_token"):
            pooling = "cls"
        elif config.get("pooling_mode_max_tokens"):
            pooling = "max"
    modules_file = directory / "modules.json"
    if modules_file.is_file():
        normalize = any(m.get("type", "").endswith("Normalize") for m in json.loads(modules_file.read_text()))
    bert_config = directory / "sentence_bert_config.json"
    if bert_config.is_file():
        max_length = int(json.loads(bert_config.read_text()).get("max_seq_length", max_length))
    return pooling, normalize, max_length


@dataclass(frozen=True)
class TaskPipeline:
    """A transformers pipeline for one task, and how the replica calls it on a batch of texts."""

    pipe: Any
    run: Callable[[list[str]], list[Any]]  # a batch of texts to one result each, under `lock`
    lock: threading.Lock  # a pipeline is not safe to call from several threads at once
    metadata: ModelMetadata
    item_adapter: TypeAdapter[Any]
    warmup_text: str


def open_pipeline(spec: ModelSpec, location: str, device: str, dtype: Any) -> TaskPipeline:
    from transformers import pipeline

    task = spec.task
    assert task is not None
    pipe = pipeline(task, model=location, device=device, dtype=dtype)
    tokenizer = pipe.tokenizer
    if tokenizer is None:
        raise ModelLoadError(f"model.source: {spec.source!r} has no tokenizer; text tasks need one")
    call_kwargs = dict(spec.call_kwargs)
    item_adapter = TEXT
    warmup_text = WARMUP_TEXTS[0]
    if task == "text-generation":
        # Batched generation needs a pad token and left padding, which GPT-2 style tokenizers lack.
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        call_kwargs.setdefault("max_new_tokens", 32)
        call_kwargs.setdefault("pad_token_id", tokenizer.pad_token_id)
        outputs = (TensorSpec(name="generated_text", datatype="BYTES"),)
    elif task == "fill-mask":
        mask = tokenizer.mask_token
        item_adapter = TypeAdapter(Annotated[str, AfterValidator(_text), AfterValidator(_has(mask))])
        warmup_text = f"The capital of France is {mask}."
        outputs = (TensorSpec(name="candidates", datatype="BYTES"),)
    else:
        outputs = (TensorSpec(name="label", datatype="BYTES"),)
    lock = threading.Lock()

    def run(texts: list[str]) -> list[Any]:
        with lock:
            results = pipe(texts, batch_size=len(texts), **call_kwargs)
        if task == "fill-mask" and len(texts) == 1:
            results = [results]  # for one text the pipeline returns its candidates unwrapped
        return [_one(task, plain(result), call_kwargs) for result in results]

    metadata = ModelMetadata(
        platform=f"transformers/{task}",
        inputs=(TensorSpec(name="text", datatype="BYTES"),),
        outputs=outputs,
    )
    return TaskPipeline(pipe, run, lock, metadata, item_adapter, warmup_text)


def _has(token: str) -> Any:
    def check(text: str) -> str:
        if token not in text:
            raise ValueError(f"text must contain the mask token {token!r}")
        return text

    return check


def _one(task: str, result: Any, call_kwargs: dict[str, Any]) -> Any:
    """One item's answer in the shape users of each task expect: unwrapped unless they asked for more."""
    if task == "text-generation":
        sequences = result if isinstance(result, list) else [result]
        texts = [sequence["generated_text"] for sequence in sequences]
        return texts if call_kwargs.get("num_return_sequences", 1) > 1 else texts[0]
    if task == "text-classification" and isinstance(result, list) and "top_k" not in call_kwargs:
        return result[0]
    return result
