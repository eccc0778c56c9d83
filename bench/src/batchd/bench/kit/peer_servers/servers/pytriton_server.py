"""PyTriton: NVIDIA Triton Inference Server (C++) batches requests and calls the model in a Python
process through shared memory.

    python -m batchd.bench.kit.peer_servers.servers.pytriton_server --model adder --host H --port P

Triton speaks the Open Inference Protocol only: POST /v2/models/<model>/infer with one input
`x` of one item (INT64 for the adder, BYTES for MiniLM and GPT-2) answers one output `y`
(INT64, FP32 vectors, BYTES text).
"""

from __future__ import annotations

import socket
from typing import Any

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

from batchd.bench.kit.peer_servers.servers import models


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def main() -> None:
    args = models.arguments(__doc__.splitlines()[0])
    predict_batch = models.load(args.model)

    @batch  # type: ignore[untyped-decorator]  # pytriton is untyped
    def infer(x: Any) -> dict[str, Any]:
        if args.model == "adder":
            return {"y": np.asarray(predict_batch(x[:, 0].tolist()), dtype=np.int64)[:, None]}
        texts = [item[0].decode() for item in x]
        if args.model == "gpt2":
            return {"y": np.asarray([[text.encode()] for text in predict_batch(texts)], dtype=np.object_)}
        return {"y": np.asarray(predict_batch(texts), dtype=np.float32)}

    adder = args.model == "adder"
    inputs = [Tensor(name="x", dtype=np.int64 if adder else bytes, shape=(1,))]
    output: dict[str, Tensor] = {
        "adder": Tensor(name="y", dtype=np.int64, shape=(1,)),
        "minilm": Tensor(name="y", dtype=np.float32, shape=(-1,)),
        "gpt2": Tensor(name="y", dtype=bytes, shape=(1,)),
    }
    outputs = [output[args.model]]
    # Triton's gRPC and metrics endpoints on loopback too, on ports of their own.
    config = TritonConfig(
        http_address=args.host,
        http_port=args.port,
        grpc_address=args.host,
        grpc_port=free_port(args.host),
        metrics_port=free_port(args.host),
        log_verbose=0,
    )
    batcher = DynamicBatcher(max_queue_delay_microseconds=round(models.BATCH_WAIT_S * 1e6))
    with Triton(config=config) as triton:
        triton.bind(
            model_name=args.model,
            infer_func=infer,
            inputs=inputs,
            outputs=outputs,
            config=ModelConfig(max_batch_size=models.MAX_BATCH_SIZE, batcher=batcher),
        )
        triton.serve()


if __name__ == "__main__":
    main()
