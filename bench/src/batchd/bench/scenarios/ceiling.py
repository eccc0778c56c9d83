"""The ceiling: what the model alone does, called in-process in a tight loop, no server in the way.

Two ceilings, both at batch size 1 and at `max_batch_size`, with the thread count the server gets:
- `raw`: transformers called directly (tokenize, forward, pool or generate, decode), the best
  a Python process can do with this model;
- `replica`: the replica's own model layer (`batchd.replica.loading.load_model` +
  `predict_batch`), the same code the server calls, so `raw` vs `replica` separates what the
  model layer costs from what the HTTP server and the batcher cost.

Both do the server's work: the same item, and for text generation the same tokens (greedy, with
min_new_tokens = max_new_tokens, so every call makes exactly that many whatever the model says);
each measurement also returns what each callable answered for the item, and the harness checks
that the servers answer exactly that.

Run as a child process (`python -m batchd.bench.scenarios.ceiling ...`) pinned to the server's cores; it
prints one JSON object on its last line. With `--on-request` it loads once and measures again for
each line on stdin, so the harness can interleave the ceiling with the server runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from batchd.api.manifest import load_manifest
from batchd.testing.models import SENTENCE


def _measure(call: Callable[[], Any], batch_size: int, duration_s: float) -> dict[str, float]:
    call()  # warm: first calls allocate
    calls = 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < duration_s or calls < 3:
        call()
        calls += 1
    return {
        "batch_size": batch_size,
        "items_per_s": calls * batch_size / elapsed,
        "batch_latency_ms": elapsed / calls * 1000,
    }


def raw_embedder(model_dir: Path) -> Callable[[list[str]], Any]:
    """Tokenize, forward, mean-pool and normalise: what sentence-transformers does for MiniLM."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()

    def embed(texts: list[str]) -> Any:
        with torch.inference_mode():
            encoded = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
            hidden = model(**encoded).last_hidden_state
            mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=1).tolist()

    return embed


def raw_generator(model_dir: Path, call_kwargs: dict[str, Any]) -> Callable[[list[str]], Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()  # type: ignore[no-untyped-call]

    def generate(prompts: list[str]) -> Any:
        with torch.inference_mode():
            encoded = tokenizer(prompts, padding=True, return_tensors="pt")
            output = model.generate(**encoded, pad_token_id=tokenizer.pad_token_id, **call_kwargs)
            new = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
            # The pipeline's answer, which the server returns: the prompt, then the new text.
            return [prompt + text for prompt, text in zip(prompts, new, strict=True)]

    return generate


def replica_model(manifest_path: Path, mirror: Path | None) -> Callable[[list[Any]], Any]:
    """The replica's own model object, called as the batcher calls it."""
    from batchd.replica.loading import load_model

    manifest = load_manifest(manifest_path)
    model = load_model(
        manifest.spec.model,
        mirror_dir=mirror,
        pvc_root=Path("/models"),
    )
    loop = asyncio.new_event_loop()
    return lambda items: loop.run_until_complete(model.predict_batch(items))


def load(args: argparse.Namespace) -> dict[str, Callable[[list[Any]], Any]]:
    """The callables to measure: transformers alone, and (with --manifest) the replica's model layer."""
    import torch

    torch.set_num_threads(args.threads)
    callables: dict[str, Callable[[list[Any]], Any]] = {}
    if args.kind == "embeddings":
        callables["raw"] = raw_embedder(args.model_dir)
    else:
        callables["raw"] = raw_generator(args.model_dir, json.loads(args.call_kwargs))
    if args.manifest is not None:
        try:
            callables["replica"] = replica_model(args.manifest, args.mirror)
        except Exception as error:  # the raw ceiling stands on its own; say why the other is missing
            callables["replica_error"] = partial(str, f"{type(error).__name__}: {error}")
    return callables


def measure(args: argparse.Namespace, callables: dict[str, Callable[[list[Any]], Any]]) -> dict[str, Any]:
    import torch

    item = json.loads(args.item)
    result: dict[str, Any] = {"threads": torch.get_num_threads(), "raw": [], "replica": [], "answers": {}}
    for kind in ("raw", "replica"):
        if kind in callables:
            for size in args.batch_sizes:
                result[kind].append(_measure(partial(callables[kind], [item] * size), size, args.duration_s))
            (result["answers"][kind],) = callables[kind]([item])
    if "replica_error" in callables:
        result["replica_error"] = callables["replica_error"]([])
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["embeddings", "generation"])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--item", default=json.dumps(SENTENCE), help="one input item, as JSON")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--duration-s", type=float, default=3.0)
    parser.add_argument("--call-kwargs", default="{}", help="generation keyword arguments, as JSON")
    parser.add_argument("--manifest", type=Path, default=None, help="also measure the replica's model layer")
    parser.add_argument("--mirror", type=Path, default=None, help="BATCHD_MODEL_MIRROR for --manifest")
    parser.add_argument(
        "--on-request",
        action="store_true",
        help="load once, then measure again for every line read on stdin (to interleave with servers)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    callables = load(args)
    if not args.on_request:
        print(json.dumps(measure(args, callables)))
        return
    print(json.dumps({"loaded": True}), flush=True)
    for _ in sys.stdin:
        print(json.dumps(measure(args, callables)), flush=True)


if __name__ == "__main__":
    main()
