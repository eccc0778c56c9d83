"""Does transformers' own continuous batching serve GPT-2 on CPU? Measured beside batchd's scheduler.

    python -m batchd.bench.generation.hf_continuous [--models tiny larger gpt2-small] [--requests 32]

transformers 5 ships a continuous-batching manager (`init_continuous_batching`, `generate_batch`,
a paged KV cache). Before writing a scheduler of our own, this checks it on the workload of
the generation benchmark, in one process, with the same prompts for everyone:

- correctness: greedy tokens identical to `model.generate` for every prompt, alone;
- requests added while others run (streaming), and a cancellation that frees the request;
- speed: output tokens/s for the same requests (prompts of 4-64 tokens, 8..256 new tokens, 8
  sequences at a time) through transformers' manager, through request-level `generate` (batches
  of 8 run until their longest answer is done), and through batchd's engine.

Writes bench/results/hf-continuous.{json,md}.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchd.bench.generation.workload import NEW_TOKENS, PROMPT_TOKENS, SHAPE
from batchd.bench.kit import cli, records
from batchd.testing.models import build_gpt2

CONFIGS: dict[str, dict[str, int]] = {
    "tiny": {"n_positions": 512},
    "larger": {"n_layer": 6, "n_embd": 512, "n_head": 8, "n_positions": 512},
    "gpt2-small": {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024},
}
RUNNING = 8


def _workload(vocabulary: int, count: int, seed: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [
        [rng.randrange(1, vocabulary) for _ in range(rng.randint(*PROMPT_TOKENS))] for _ in range(count)
    ]
    return prompts, [rng.randint(*NEW_TOKENS) for _ in prompts]


def measure(key: str, directory: Path, requests: int, threads: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from batchd.api.spec import GenerationSpec, ModelSpec
    from batchd.replica.generation.loader import load_token_level
    from batchd.replica.generation.params import GenerationParams, GenerationRequest
    from batchd.replica.models.executor import ModelExecutor
    from batchd.replica.models.pipelines import TEXT

    torch.set_num_threads(threads)
    if not (directory / "config.json").exists():
        build_gpt2(directory, **CONFIGS[key])
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model: Any = AutoModelForCausalLM.from_pretrained(directory)
    model = model.eval()
    prompts, lengths = _workload(len(tokenizer), requests, seed=2)
    total = sum(lengths)
    pad = tokenizer.pad_token_id

    def alone(prompt: list[int], new: int) -> list[int]:
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False, pad_token_id=pad)  # fmt: skip
        return list(out[0, len(prompt) :].tolist())

    reference = [alone(p, n) for p, n in zip(prompts, lengths, strict=True)]

    # Request-level: batches of RUNNING prompts, left-padded, each until its longest answer is done.
    started = time.perf_counter()
    for i in range(0, requests, RUNNING):
        batch, news = prompts[i : i + RUNNING], lengths[i : i + RUNNING]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=max(news), min_new_tokens=max(news),
                           do_sample=False, pad_token_id=pad)  # fmt: skip
    request_level = total / (time.perf_counter() - started)

    # transformers' continuous batching, sized as the others (RUNNING sequences, a bounded cache).
    config = GenerationConfig(do_sample=False, max_new_tokens=256, eos_token_id=-1, pad_token_id=pad)  # type: ignore[no-untyped-call]
    longest = max(len(p) for p in prompts) + max(lengths)
    cb_config = ContinuousBatchingConfig(
        page_size=32, num_blocks=RUNNING * (longest // 32 + 2), max_batch_tokens=512,
        max_requests_per_batch=RUNNING, allow_block_sharing=False,
    )  # fmt: skip
    manager = model.init_continuous_batching(generation_config=config, continuous_batching_config=cb_config)
    manager.start()
    try:
        started = time.perf_counter()
        request_ids = [
            manager.add_request(p, request_id=f"r{i}", max_new_tokens=n)
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
        ]
        results: dict[str, Any] = {}
        while len(results) < len(request_ids):
            output = manager.get_result(timeout=60)
            if output is None:
                break
            if output.is_finished():
                results[output.request_id] = output
        library = total / (time.perf_counter() - started)
        identical = sum(
            results[f"r{i}"].generated_tokens == reference[i] for i in range(requests) if f"r{i}" in results
        )
        # Added while others run, streamed; then one cancelled mid-way.
        for i, (p, n) in enumerate(zip(prompts[:8], lengths[:8], strict=True)):
            manager.add_request(p, request_id=f"s{i}", max_new_tokens=n, streaming=True)
        streamed: dict[str, Any] = {}
        while len(streamed) < 8:
            output = manager.get_result(timeout=60)
            if output is None:
                break
            if output.is_finished():
                streamed[output.request_id] = output.generated_tokens
        staggered = sum(streamed.get(f"s{i}") == reference[i] for i in range(8))
        manager.add_request(prompts[0], request_id="cancel", max_new_tokens=200, streaming=True)
        manager.get_result(timeout=60)
        manager.cancel_request("cancel")
        processor = manager.batch_processor
        deadline = time.monotonic() + 10  # the manager's thread drops it at its next step
        while processor is not None and processor.scheduler.active_requests and time.monotonic() < deadline:
            time.sleep(0.01)
        freed = processor is not None and not processor.scheduler.active_requests
    finally:
        manager.stop(block=True, timeout=30)

    # batchd's engine, offline, on the same requests.
    spec = ModelSpec(task="text-generation", source=f"file://{directory}", generation=GenerationSpec())
    ours = load_token_level(spec, str(directory), "cpu", torch.float32, ModelExecutor(), TEXT)
    ours.engine.set_max_running(RUNNING)
    batchd_requests = [
        GenerationRequest("", tuple(p), GenerationParams(max_new_tokens=n, min_new_tokens=n))
        for p, n in zip(prompts, lengths, strict=True)
    ]
    ours.engine.run_to_completion(batchd_requests[:2])  # warm
    started = time.perf_counter()
    chunks = ours.engine.run_to_completion(batchd_requests)
    engine = total / (time.perf_counter() - started)
    engine_identical = sum(
        [t for c in cs for t in c.token_ids] == reference[i] for i, cs in enumerate(chunks)
    )
    return {
        "model": key,
        "config": CONFIGS[key],
        "requests": requests,
        "output_tokens": total,
        "threads": threads,
        "tokens_per_s": {
            "transformers_continuous": library,
            "request_level_generate": request_level,
            "batchd_engine": engine,
        },
        "greedy_identical": {"transformers_continuous": identical, "batchd_engine": engine_identical},
        "added_while_running_identical": staggered,
        "cancelled_request_freed": freed,
    }


def to_markdown(results: dict[str, Any]) -> str:
    ran = records.ran(results["meta"], "transformers " + results["meta"]["transformers"])
    lines = [
        "# transformers' continuous batching on CPU, beside batchd's scheduler",
        "",
        f"{ran}. {RUNNING} sequences at a time; {SHAPE}.",
        "",
        "| model | torch threads | requests | transformers continuous tokens/s | request-level generate "
        "tokens/s | batchd engine tokens/s | greedy identical to generate (transformers / batchd) | "
        "added mid-run identical | cancel frees |",
        "|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r in results["runs"]:
        speed, same = r["tokens_per_s"], r["greedy_identical"]
        lines.append(
            f"| {r['model']} {r['config']} | {r['threads']} | {r['requests']} | "
            f"{speed['transformers_continuous']:,.0f} | "
            f"{speed['request_level_generate']:,.0f} | {speed['batchd_engine']:,.0f} | "
            f"{same['transformers_continuous']}/{r['requests']} / {same['batchd_engine']}/{r['requests']} | "
            f"{r['added_while_running_identical']}/8 | {'yes' if r['cancelled_request_freed'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = cli.parser("batchd.bench.generation.hf_continuous", __doc__)
    parser.add_argument("--models", nargs="+", choices=sorted(CONFIGS), default=["tiny", "larger"])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch threads, each measured")
    cli.add_output(parser)
    args = parser.parse_args(argv)
    import transformers

    meta = {
        **records.run_meta("batchd.bench.generation.hf_continuous", argv),
        "transformers": transformers.__version__,
    }
    with tempfile.TemporaryDirectory(prefix="batchd-hf-continuous-") as workdir:
        runs = [
            measure(key, Path(workdir) / key, args.requests, threads)
            for key in args.models
            for threads in args.threads
        ]
    results = {"meta": meta, "runs": runs}
    markdown = to_markdown(results)
    records.publish(args.output_dir, "hf-continuous", results, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
