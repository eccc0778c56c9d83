"""What every benchmark is built from: nothing here knows about any one benchmark.

`loadgen` drives any HTTP endpoint (closed and open loops over keep-alive connections), `stats`
summarises what it saw, `promtext` reads a server's `/metrics`, `procstat` a process's CPU and
memory, `servers` starts `batchd serve` (or any server) and waits until it is ready, `models` and
`manifests` say what it serves, `records` writes where, when and how a run went, `formatting` and
`charts` turn figures into the text and pictures of a report.
"""

from pathlib import Path

# The checkout this package was installed from (editable): handlers such as examples.adder import
# from there, and every benchmark writes its committed figures under it.
CHECKOUT = Path(__file__).resolve().parents[5]
RESULTS_DIR = CHECKOUT / "bench" / "results"
