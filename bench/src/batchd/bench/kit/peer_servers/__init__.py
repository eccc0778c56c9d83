"""The peer servers side by side: batchd, its variants, two bounds (bare uvicorn, `minimal`) and the
Python serving frameworks with dynamic batching, each installed into an environment of its own
(`venvs`), started alone (`workload`), driven by the same closed loop and read from its process
tree (`results`), one table per model (`table`). The peers benchmark runs them all; the prefix
benchmark runs batchd's generator with its cache on and off beside them.

Imports nothing: a peer's own environment imports `servers` from here with bench/src on its path,
and has neither batchd nor its dependencies.
"""
