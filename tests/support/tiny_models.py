"""Tiny BERT models built on this machine (no hub): for the fill-mask and text-classification paths.

Random weights with a fixed seed and a WordPiece vocabulary trained on a few sentences: the
answers are meaningless, but tokenisation, the forward pass and the pipeline's post-processing
all run for real.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "the capital of france is paris",
    "batching gathers requests into one forward pass",
    "this movie was wonderful and i loved it",
    "this movie was terrible and i hated it",
] * 4


def build_bert(directory: Path, head: str) -> Path:
    """A 2-layer BERT with a `masked-lm` or `classification` head, saved with its tokenizer."""
    import torch
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(CORPUS, vocab_size=200, min_frequency=1)
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
