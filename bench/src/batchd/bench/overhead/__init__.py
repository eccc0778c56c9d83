"""`python -m batchd.bench.overhead`: what the replica's server costs per request, beside the floor
and a peer.

The trivial adder (max batch 32, 10 ms wait) under a closed loop of 128 clients, the server on
one core and the load generator on another, for each subject in turn within every repeat:

- `batchd`: a replica of this checkout (`batchd serve`);
- `baseline`: the same replica from another source tree (`--baseline-src`), to measure a change;
- `bare`: the floor, uvicorn with httptools and a raw ASGI app that decodes the request and
  encodes the adder's answer, with no batching (what uvicorn alone costs);
- `mosec`: Mosec serving the same adder with the same batching, from its own virtual
  environment (`--mosec-python`, or BATCHD_BENCH_MOSEC_PYTHON);
- `minimal`: the least a batching server on uvicorn does per request (`minimal`): batchd's
  connection protocol and model thread with none of its checks, watches or metrics, so that
  batchd beside it shows what those cost, and it beside Mosec what uvicorn does.

Reported per subject (medians over the repeats): req/s, p50/p99, and the server's CPU per
request (user + system time of its process and its children over the measured window).
"""
