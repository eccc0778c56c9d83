"""Tracing benchmark: what OpenTelemetry tracing costs a request through the router, with tracing
off, recording every request, and recording 1% of them.

    python -m batchd.bench.tracing            # adder and MiniLM, 5 interleaved repeats
    python -m batchd.bench.tracing --quick    # smoke-sized: the adder, one short repeat

Real processes of this machine: for each setting its own router (`batchd-router`, reading a real
API server with no node, where the benchmark publishes the replicas as EndpointSlices) and its own
`batchd serve` replica of each model, the traced ones exporting over OTLP/HTTP to a real Jaeger
(built from its Go module, `make jaeger`). Each repeat measures every setting of a model in turn
(who goes first rotates), a closed loop of the kit's lean client through the router; the requests
per second, and the CPU per request of the router and of the replica from /proc over the measured
window, as the peers benchmark reads a server's. Ratios are against tracing off in the same repeat;
the report quotes their medians. What was exported is read back from Jaeger: a marker request's
whole trace at 100%, and the number of traces stored at 1%.

`spans` measures, in this process, what the two parts batchd writes itself instead of the SDK's
cost per span: a request's two spans through the SDK's Tracer against `batchd.api.spans`, and the
SDK's OTLP encoding against `batchd.api.otlp`'s.

Goals, checked and reported, not failed on: at 100% sampling at least 0.95x the
requests per second of tracing off, at 1% at least 0.99x. Results: bench/results/tracing.{json,md,png}.
"""
