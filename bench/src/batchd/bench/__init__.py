"""batchd's demo and benchmarks (dev only; never in an image).

`kit` holds what every benchmark is built from (load generation, statistics, process sampling, the
peer servers side by side, records, formatting and charts); each benchmark is a package of its own
on top of it, importing no other benchmark (an import contract), run as
`python -m batchd.bench.<name>`. `make bench` runs the peers benchmark on batchd's own subjects
(`batchd.bench.peers`).
"""
