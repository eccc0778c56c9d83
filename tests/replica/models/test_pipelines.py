"""transformers tasks through the model layer, with tiny models built here and the bundled MiniLM."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import pytest
from pydantic import ValidationError

from batchd.api.spec import ModelSpec
from batchd.replica.loading import load_model
from batchd.replica.models import ModelLoadError
from batchd.replica.models.base import BatchModel
from batchd.replica.models.devices import choose_device, choose_dtype
from batchd.replica.models.sources import resolve_source
from batchd.testing.models import MINILM_SOURCE, build_bert, build_gpt2, minilm_mirror

pytestmark = pytest.mark.slow


def load(tmp: Path | None = None, **model: Any) -> BatchModel:
    return load_model(ModelSpec(**model), mirror_dir=tmp, pvc_root=Path("/models"))


@pytest.fixture(scope="module")
def fill_mask(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BatchModel]:
    directory = build_bert(tmp_path_factory.mktemp("bert-mlm"), "masked-lm")
    model = load(task="fill-mask", source=f"file://{directory}", device="cpu")
    yield model
    model.close()


@pytest.mark.parametrize(
    "texts", [["the capital of france is [MASK]", "this movie was [MASK]"], ["[MASK] movie"]]
)
def test_fill_mask_gives_ranked_candidates_per_item(fill_mask: BatchModel, texts: list[str]) -> None:
    results = asyncio.run(fill_mask.predict_batch(texts))
    assert len(results) == len(texts)
    for candidates in results:
        assert len(candidates) == 5
        scores = [c["score"] for c in candidates]
        assert scores == sorted(scores, reverse=True)
        assert all(isinstance(c["token_str"], str) and "[MASK]" not in c["sequence"] for c in candidates)


def test_fill_mask_refuses_items_without_the_mask_token(fill_mask: BatchModel) -> None:
    with pytest.raises(ValidationError, match=r"mask token '\[MASK\]'"):
        fill_mask.item_adapter.validate_python("no mask here")


@pytest.fixture(scope="module")
def bert_classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bert(tmp_path_factory.mktemp("bert-cls"), "classification")


def test_text_classification_labels_each_item(bert_classifier: Path) -> None:
    model = load(task="text-classification", source=f"file://{bert_classifier}", device="cpu")
    try:
        results = asyncio.run(
            model.predict_batch(["this movie was wonderful", "this movie was terrible", "paris"])
        )
    finally:
        model.close()
    assert len(results) == 3
    assert all(r["label"] in ("NEGATIVE", "POSITIVE") and 0 <= r["score"] <= 1 for r in results)


def test_text_classification_with_top_k_keeps_every_label(bert_classifier: Path) -> None:
    model = load(
        task="text-classification",
        source=f"file://{bert_classifier}",
        device="cpu",
        call_kwargs={"top_k": 2},
    )
    try:
        results = asyncio.run(model.predict_batch(["this movie was wonderful", "paris"]))
    finally:
        model.close()
    assert [sorted(r["label"] for r in labels) for labels in results] == [["NEGATIVE", "POSITIVE"]] * 2


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory: Path = build_gpt2(tmp_path_factory.mktemp("tiny-gpt2"), vocab_size=500)
    return directory


def test_text_generation_batches_prompts_of_different_lengths_as_if_alone(gpt2_dir: Path) -> None:
    # Greedy decoding: a prompt's continuation must not depend on the batch's padding.
    model = load(
        task="text-generation",
        source=f"file://{gpt2_dir}",
        device="cpu",
        call_kwargs={"max_new_tokens": 6, "do_sample": False},
    )
    prompts = ["Once upon a time", "The quick brown fox jumps over the lazy dog while", "Batching"]
    try:
        together = asyncio.run(model.predict_batch(prompts))
        alone = [asyncio.run(model.predict_batch([prompt]))[0] for prompt in prompts]
    finally:
        model.close()
    assert together == alone
    assert all(text.startswith(p) and len(text) > len(p) for p, text in zip(prompts, together, strict=True))
    assert model.metadata.outputs[0].name == "generated_text"


def test_text_generation_returns_every_sequence_asked_for(gpt2_dir: Path) -> None:
    model = load(
        task="text-generation",
        source=f"file://{gpt2_dir}",
        device="cpu",
        call_kwargs={"max_new_tokens": 4, "do_sample": True, "num_return_sequences": 3},
        generation={"scheduling": "request"},  # a pipeline argument token-level scheduling has not
    )
    try:
        results = asyncio.run(model.predict_batch(["Once upon a time", "Batching"]))
    finally:
        model.close()
    assert [len(texts) for texts in results] == [3, 3]
    assert all(text.startswith("Batching") for text in results[1])


def test_embeddings_in_a_batch_equal_embeddings_alone(tmp_path: Path) -> None:
    model = load(minilm_mirror(tmp_path), task="feature-extraction", source=MINILM_SOURCE, device="cpu")
    try:
        texts = ["short", "a much longer sentence that needs padding in the batch"]
        together = asyncio.run(model.predict_batch(texts))
        alone = [asyncio.run(model.predict_batch([text]))[0] for text in texts]
    finally:
        model.close()
    for a, b in zip(together, alone, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
    assert model.metadata.outputs[0].shape == (-1, 384)


def test_empty_text_is_refused_before_it_reaches_a_batch(tmp_path: Path) -> None:
    model = load(minilm_mirror(tmp_path), task="feature-extraction", source=MINILM_SOURCE, device="cpu")
    model.close()
    with pytest.raises(ValidationError, match="text is empty"):
        model.item_adapter.validate_python("   ")
    with pytest.raises(ValidationError):
        model.item_adapter.validate_python(42)


def test_sources_resolve_and_say_which_field_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "mirror" / "org" / "name").mkdir(parents=True)
    (tmp_path / "claims" / "weights" / "gpt2").mkdir(parents=True)
    mirror, claims = tmp_path / "mirror", tmp_path / "claims"
    assert resolve_source("hf://org/name", mirror_dir=mirror, pvc_root=claims) == str(mirror / "org" / "name")
    assert resolve_source("hf://org/other", mirror_dir=mirror, pvc_root=claims) == "org/other"  # the hub
    assert resolve_source("pvc://weights/gpt2", mirror_dir=None, pvc_root=claims) == str(
        claims / "weights" / "gpt2"
    )
    assert resolve_source(f"file://{claims}", mirror_dir=None, pvc_root=claims) == str(claims)
    with pytest.raises(ModelLoadError, match=r"model.source: 'pvc://weights/missing' resolves to"):
        resolve_source("pvc://weights/missing", mirror_dir=None, pvc_root=claims)
    with pytest.raises(ModelLoadError, match=r"model\.source: 'file:///no/such/dir'"):
        load(task="fill-mask", source="file:///no/such/dir", device="cpu")


def test_an_hf_source_missing_offline_points_at_the_mirror_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hub in offline mode (HF_HUB_OFFLINE=1, as air-gapped clusters set it) fails at once; an
    # unreachable hub fails the same way after ~25 s of the hub client's retries.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="BATCHD_MODEL_MIRROR"):
        load(tmp_path, task="fill-mask", source="hf://nobody/nothing", device="cpu")


@pytest.mark.parametrize(
    ("device", "dtype", "cuda", "expected"),
    [
        ("auto", "auto", False, ("cpu", "float32")),
        ("auto", "auto", True, ("cuda", "float16")),
        ("cpu", "auto", True, ("cpu", "float32")),
        ("cuda", "bfloat16", True, ("cuda", "bfloat16")),
        ("auto", "float32", True, ("cuda", "float32")),
    ],
)
def test_device_and_dtype_follow_the_spec(
    device: str, dtype: str, cuda: bool, expected: tuple[str, str]
) -> None:
    chosen = choose_device(device, cuda)
    assert (chosen, choose_dtype(dtype, chosen)) == expected


def test_asking_for_cuda_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(ModelLoadError, match=r"model\.device: 'cuda'"):
        choose_device("cuda", cuda_available=False)
