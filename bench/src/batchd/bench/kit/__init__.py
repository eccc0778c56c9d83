"""What every benchmark is built from: nothing here knows about any one benchmark.

`command` is every benchmark's command line and what it writes, `loadgen` drives any HTTP
endpoint (closed and open loops over keep-alive connections), `streams` reads a streamed answer
event by event, `repeats` interleaves the subjects over repeats and compares each with its
baseline within a repeat, `stats` summarises what it saw, `procstat` reads a process's CPU and
memory, `records` writes where, when and how a run went, `goals` states and checks a goal,
`formatting`, `tables` and `charts` turn figures into the text, tables and pictures of a report,
`peer_servers` runs batchd and the serving frameworks side by side. The servers a benchmark
starts, the models they serve and their manifests come from the test support
(`batchd.testing.servers`, `models`, `manifests`), and so does the reading of a server's
`/metrics` (`batchd.testing.promtext`).
"""

from pathlib import Path

# The checkout this package was installed from (editable): handlers such as examples.adder import
# from there, and every benchmark writes its committed figures under it.
CHECKOUT = Path(__file__).resolve().parents[5]
RESULTS_DIR = CHECKOUT / "bench" / "results"
