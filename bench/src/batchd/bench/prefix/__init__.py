"""Prefix caching and prefix-aware routing: what they gain where prompts share a beginning, and what
they cost where none do, in one run, interleaved and repeated.

    python -m batchd.bench.prefix [--quick] [--parts replica routing peers] [--repeats 3]

Real processes of this machine: `batchd serve` replicas of a tiny GPT-2 built here (4 layers of
256, random weights, a context of 1,024 tokens), greedy, every answer 32 tokens; requests through
the OpenAI routes, streamed, each answer's usage saying how many prompt tokens were cached.
- replica: two replicas, identical but for `model.generation.prefix_cache_bytes` (512 MiB, and 0:
  off), one loaded at a time, on one core, the load on the other. Four workloads: 8 system prompts
  of 768 tokens with questions of 32-64 tokens; 16 conversations of 6 turns through
  `/v1/chat/completions`; unique prompts of the same length, as the control; one hot prefix.
  Capacity is a closed loop of 32 clients (completions and tokens/s: each client's own rate over
  the window, summed); the time to first token of the system prompts is an open loop at half the
  capacity without the cache; the conversations' from their third turn on.
- routing: two replicas with the cache behind two routers, one routing by prompt prefix (the
  default), one by the power of two choices alone (`BATCHD_PREFIX_ROUTING=false`), on a real API
  server with no node (`make kubernetes` builds it). Conversations arrive open loop at 70% of the
  power-of-two capacity (each replica's cache holds about half of what the conversations hold):
  hit rate and p90 time to first token; one hot prefix and unique prompts, closed loop: throughput.
- peers: the peers benchmark's tiny GPT-2 load (`batchd.bench.peers`, 32 clients, 64 tokens a
  request, the clients' starts spread over the warm-up, each client's own rate summed, so that it
  resolves finer than a round) with batchd's cache on and off beside every peer
  that can be installed.
Each repeat runs every subject of a part in an order that turns; medians over repeats, ratios
within each repeat. Goals are checked and reported, not failed on; a run exits 1 only when it
measured nothing. Results: bench/results/prefix.{json,md,png}.
"""
