"""Overload: an open loop at ten times what a replica can serve, and what the replica promises then.

    python -m batchd.bench.overload [--duration-s 60] [--times 10]

One real replica (`batchd serve`) whose every batch holds the model for a fixed time, so its
capacity is known: max_batch_size / BATCH_S items a second. Its queue holds about one second of
that work (`max_queued_requests`), the bound the README recommends. Requests arrive at `times`
that rate, whatever the answers do, over a keep-alive aiohttp pool. Checked, and reported:
- every answer is a 200, or a 503 or 429 that carries Retry-After; none is lost or reset;
- resident memory stays flat: after the warm-up, its highest sample within 10% of its lowest;
- service is back within a second of the load ending: a request answered 200, in under a second.
"""
