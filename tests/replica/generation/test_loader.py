"""The load check of token-level generation: a model whose greedy tokens are `generate`'s is
accepted (and keeps its prefix cache) whatever its tokenizer does to the text of a token decoded
alone; a model the engine really drives differently is refused, naming the first token where
the two part.

Tokenizers of the three families transformers models use are built here (small vocabularies of
the test corpus), each with GPT-2s of random weights and several seeds: WordPiece (BERT's,
MiniLM's), byte-level BPE (GPT-2's) and a SentencePiece-style BPE whose decoder turns `▁` into a
space, falls back to bytes and strips one leading space (Llama-2's, Mistral's). The engine
decodes its first new token in the prompt's context; decoded alone, a word's token loses its
leading space (WordPiece, SentencePiece), a WordPiece continuation keeps its `##`, and half a
character is a replacement character (byte-level BPE): the same tokens, other text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from batchd.api.spec import ModelSpec
from batchd.replica.generation.loader import WARMUP_PROMPTS, TokenGenerationModel, load_text_generation
from batchd.replica.generation.params import GenerationParams
from batchd.replica.models.base import ModelLoadError
from batchd.replica.models.executor import ModelExecutor
from batchd.testing.models import GPT2_CORPUS, TINY_GPT2

NEW_TOKENS = 6
# Prompts whose next token may start a word: the first new token then has a leading space.
PROMPTS = (*WARMUP_PROMPTS, "Once upon a time there was a batching", "the model computes its")


def wordpiece() -> Any:
    """WordPiece over the corpus's words (a fixed vocabulary: WordPiece's trainer is not
    deterministic), its decoder BERT's: a word decoded alone has no leading space."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    split = pre_tokenizers.BertPreTokenizer()
    words = sorted({word for text in GPT2_CORPUS for word, _ in split.pre_tokenize_str(text.lower())})
    letters = sorted({letter for word in words for letter in word})
    vocabulary = dict.fromkeys(["[PAD]", "[UNK]", "[SEP]", *letters, *(f"##{c}" for c in letters), *words])
    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocabulary)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = split
    tokenizer.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", eos_token="[SEP]"
    )


def byte_level_bpe() -> Any:
    """GPT-2's kind: a token's leading space is a byte of the token."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(GPT2_CORPUS, vocab_size=500, special_tokens=["<|endoftext|>"])
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


def sentencepiece_style() -> Any:
    """Llama-2's and Mistral's tokenizer.json: `▁` for spaces, one in front of the text, byte
    fallback; the decoder turns `▁` back into spaces and strips one leading space."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    special = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256))]
    # Trained on words (as SentencePiece is), then run on the whole text as Llama's is.
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.train_from_iterator(GPT2_CORPUS, trainers.BpeTrainer(vocab_size=600, special_tokens=special))
    tokenizer.pre_tokenizer = None
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


TOKENIZERS: dict[str, Callable[[], Any]] = {
    "wordpiece": wordpiece,
    "byte-level-bpe": byte_level_bpe,
    "sentencepiece-style": sentencepiece_style,
}
# (tokenizer, seed) of the tiny GPT-2 (4 layers of 256). For each tokenizer, a comparison of text
# accepted the first model, refused the second and served the third without the prefix cache.
MODELS = [
    ("wordpiece", 0),
    ("wordpiece", 1),
    ("wordpiece", 7),
    ("byte-level-bpe", 0),
    ("byte-level-bpe", 3),
    ("byte-level-bpe", 2),
    ("sentencepiece-style", 0),
    ("sentencepiece-style", 4),
    ("sentencepiece-style", 2),
]


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tokenizer, built once and saved to a directory of its own."""
    saved = {}
    for name, build in TOKENIZERS.items():
        directory = tmp_path_factory.mktemp(name)
        build().save_pretrained(directory)
        saved[name] = directory
    return saved


def gpt2(tokenizer_dir: Path, directory: Path, seed: int) -> Any:
    """A GPT-2 of random weights (`seed`) for the tokenizer in `tokenizer_dir`, saved with it."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.save_pretrained(directory)
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    ids = {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), **ids, **TINY_GPT2))
    model.eval().save_pretrained(directory)  # type: ignore[no-untyped-call]
    return model, tokenizer


def load(directory: Path) -> TokenGenerationModel:
    spec = ModelSpec.model_validate(
        {"task": "text-generation", "source": f"file://{directory}", "device": "cpu",
         "generation": {"max_new_tokens": 16}}
    )  # fmt: skip
    loaded = load_text_generation(spec, str(directory), ModelExecutor())
    assert isinstance(loaded, TokenGenerationModel)
    return loaded


def generated(model: Any, prompt_ids: tuple[int, ...], pad_id: int) -> list[int]:
    """transformers' greedy tokens for a prompt alone."""
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids])
        output = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=pad_id,
        )
    return [int(token) for token in output[0, ids.shape[1] :]]


@pytest.mark.parametrize(("tokenizer", "seed"), MODELS, ids=[f"{t}-seed{s}" for t, s in MODELS])
async def test_a_model_whose_greedy_tokens_are_generates_is_accepted_whatever_its_tokenizer(
    tokenizer_dirs: dict[str, Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    tokenizer: str,
    seed: int,
) -> None:
    reference, encoder = gpt2(tokenizer_dirs[tokenizer], tmp_path, seed)
    model = load(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="batchd"):
            await model.warmup(1)  # refuses a model it cannot drive
        warnings = [r.getMessage() for r in caplog.records if r.name.startswith("batchd")]
        assert not warnings  # such as: the prefix cache is off
        params = GenerationParams(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
        requests = [model.preparer.prepare_ids(encoder(p)["input_ids"], params, "prompt") for p in PROMPTS]
        answers = model.engine.run_to_completion(requests)
        ours = [[t for chunk in chunks for t in chunk.token_ids] for chunks in answers]
        assert ours == [generated(reference, r.prompt_ids, encoder.eos_token_id) for r in requests]
    finally:
        model.close()


async def test_a_model_the_engine_drives_differently_is_refused_naming_the_first_token_that_differs(
    tokenizer_dirs: dict[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM

    # A sliding window shorter than the warm-up prompt: generate attends to the last 4 tokens,
    # the engine to all of them.
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dirs["sentencepiece-style"])
    tokenizer.save_pretrained(tmp_path)
    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, sliding_window=4,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    reference = MistralForCausalLM(config).eval()  # type: ignore[no-untyped-call]
    reference.save_pretrained(tmp_path)
    model = load(tmp_path)
    try:
        with pytest.raises(ModelLoadError) as refused:
            await model.warmup(1)
    finally:
        model.close()
    message = str(refused.value)
    found = re.fullmatch(
        r"model\.generation\.scheduling: token-level scheduling cannot drive this model's forward pass "
        r"\(new token (\d+): greedy id (\d+), transformers' generate id (\d+); "
        r"greedy '.*', transformers' generate '.*'\); use scheduling: request",
        message,
        re.DOTALL,
    )
    assert found, message
    position, ours, theirs = (int(group) for group in found.groups())
    prompt = model.preparer.encode(WARMUP_PROMPTS[0])
    expected = generated(reference, prompt, tokenizer.eos_token_id)
    assert theirs == expected[position - 1] and ours != theirs


async def test_a_model_whose_own_generation_config_changes_greedy_decoding_is_still_accepted(
    tokenizer_dirs: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Models ship defaults for `generate` (Qwen2.5-Instruct a repetition penalty of 1.05): the
    check compares the forward passes, so its reference is plain greedy decoding, whatever the
    model's generation_config says."""
    from transformers import GenerationConfig

    reference, _ = gpt2(tokenizer_dirs["byte-level-bpe"], tmp_path, seed=0)
    penalising = GenerationConfig(  # type: ignore[no-untyped-call]
        repetition_penalty=5.0, no_repeat_ngram_size=1, **reference.generation_config.to_diff_dict()
    )
    penalising.save_pretrained(tmp_path)
    model = load(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="batchd"):
            await model.warmup(1)
        assert not [r.getMessage() for r in caplog.records if r.name.startswith("batchd")]
    finally:
        model.close()
