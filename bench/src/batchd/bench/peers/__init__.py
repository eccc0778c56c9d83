"""Peers benchmark: batchd beside Mosec, LitServe, Ray Serve, BentoML and Triton (PyTriton) on the
same models, under the same load; beside itself with batches of one (`unbatched`: what batching
gains); beside two bounds on the trivial adder, bare uvicorn (`floor`) and the least a batching
server on uvicorn does (`minimal`); and, with `--baseline-src`, beside batchd from another source
tree (`baseline`), to measure a change.

    python -m batchd.bench.peers                          # every peer, every model, 3 x 10 s each
    python -m batchd.bench.peers --peers batchd unbatched floor   # `make bench`: no peer to install
    python -m batchd.bench.peers --peers batchd mosec --models adder
    python -m batchd.bench.peers --quick                  # smoke-sized: 1 s runs, one repeat

Each peer other than batchd runs from a virtual environment of its own, made by the benchmark
from the pinned file `requirements/<peer>.txt` under build/peers/<peer>-<hash>/ (and reused while
the file is unchanged; the first run downloads Ray and the others from PyPI, minutes). Every
server is a small script in `servers/` calling the same model code (`servers/models.py`): the
trivial adder (128 clients), MiniLM-L6 embeddings from the bundled weights (64 clients) and a
tiny GPT-2 built here (32 clients, 64 new tokens a request, greedy: transformers' `generate` on
each batch the peer forms; batchd schedules tokens), max batch 32 and a 10 ms wait everywhere.
One server runs at a time, its every process on the first core and the load generator (the
kit's closed loop) on the others; the servers' order turns each repeat; req/s, p50/p99, the
server tree's CPU per request and memory are read per run, and the MiniLM model alone
(in-process, batch 32) takes its turn as the ceiling. Ratios to Mosec and to
batchd are taken within each repeat. A peer that cannot be installed or started is reported with
the reason, and the others go on. Goals are checked and reported, not failed on; a run exits 1
only when nothing could be measured.
Results: bench/results/peers.{md,json,png}.
"""
