"""A tiny GPT-2 built on this machine: the text-generation scenario needs weights and no hub.

Random weights (fixed seed) and a byte-level BPE tokenizer trained on a few sentences: the
text it writes is nonsense, but every step of generation (tokenize, prefill, 16 decode steps,
detokenize) runs for real, which is what a benchmark of the serving path needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Small enough to build in seconds, large enough that the model, not Python, dominates a batch.
CONFIG: dict[str, Any] = {"n_layer": 4, "n_embd": 256, "n_head": 4, "n_positions": 256}
CORPUS = [
    "Once upon a time there was a batching server that gathered requests into batches.",
    "The quick brown fox jumps over the lazy dog while the model computes its answer.",
    "Sentence embeddings and text generation are served by replicas on Kubernetes.",
    "Throughput rises with the batch size until the model itself becomes the limit.",
] * 8


def build(directory: Path, vocab_size: int = 2000) -> Path:
    """Write a tokenizer and a randomly initialised GPT-2 into `directory`; returns it."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=vocab_size, special_tokens=["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        padding_side="left",  # decoder-only models generate after the prompt, so pad before it
    )
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **CONFIG,
    )
    GPT2LMHeadModel(config).eval().save_pretrained(directory)  # type: ignore[no-untyped-call]
    return directory
