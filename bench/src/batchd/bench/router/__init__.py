"""Router benchmark: what the router does for a keep-alive client, what it costs, how it holds
requests for a deployment at zero replicas.

    python -m batchd.bench.router                  # every part, repeated, interleaved
    python -m batchd.bench.router keepalive        # or some: keepalive, cost, zero
    python -m batchd.bench.router --quick          # smoke-sized: short runs, one repeat

Real processes of this machine: `batchd serve` replicas, the router (`python -m batchd.router`)
on its Role's ServiceAccount, reading a real API server (the test cluster's, with no node: `make
kubernetes` builds it), where the benchmark publishes replicas as EndpointSlices.
- keepalive: a slow adder (160 items/s a replica) at 400 req/s from an aiohttp client with a
  32-connection keep-alive pool, scaled from 1 to 4 replicas, through a connection-balancing
  proxy (what a Service does) and through the router; then steady runs at 80% of capacity through
  each, beside one replica alone at the same utilisation (the p99 baseline). Chart: each
  replica's share over time.
- cost: the p50 the router adds on a trivial adder, and its CPU per request (from /proc), as
  ratios to going direct in the same rounds.
- zero: a deployment at zero replicas gets traffic; a stand-in for the operator reads the
  router's `GET /held` and starts a replica; the first request's wait against the replica's own
  load time. Chart: held requests over time.
Goals are checked and reported, not failed on; a run exits 1 only when it could not measure.
Results: bench/results/router.{md,json}, router-keepalive.png, router-zero.png.
"""
