"""Access benchmark: what deciding who calls costs the router, on the trivial adder, with access off
(an open deployment), an API key, and a ServiceAccount token whose review is cached.

    python -m batchd.bench.access            # 5 interleaved repeats of each way in
    python -m batchd.bench.access --quick    # smoke-sized: one short repeat

Real processes of this machine: one router (`batchd-router`, reading a real API server with no node,
where the benchmark publishes the upstream as EndpointSlices) in front of the cheapest upstream
there is (`kit.floor`), and two BatchedDeployments on it: one open, one with `spec.access` whose
tenants are an API key's (in the access Secret, as the operator writes it) and a ServiceAccount's,
whose token the API server issues (TokenRequest, audience `batchd`) and reviews (TokenReview and
SubjectAccessReview, on the router's own ServiceAccount bound to `system:auth-delegator`). Each
repeat measures every way in turn (who goes first rotates): p50 and p99 with one request in flight,
then the router's CPU per request from /proc with `in_flight` in flight. The TokenReviews are those
the API server's audit log records of the router.

The cache probe (`probe`): through the same router, to a `batchd serve` replica of a tiny GPT-2 with
a prefix cache, tenant beta sends prompts tenant alpha has cached, claiming alpha in every header it
may write, interleaved with fresh prompts of its own of the same length: how often it hit, and its
answer time against the fresh ones'.

Goals (issue 50), checked and reported, not failed on: at most 15 us of router CPU per request
added by a key, and by a token whose review is cached, against access off in the same repeat; at
most one TokenReview per token per review TTL; beta's probe never hits, and takes at least 0.9x a
fresh prompt's time (medians). Results: bench/results/access.{json,md,png}.
"""
