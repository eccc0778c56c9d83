"""The main job (`make demo`, `python -m batchd.bench.demo`): serve the bundled MiniLM model and
show what batching buys. It runs on the kit alone, with none of the tests' support."""
