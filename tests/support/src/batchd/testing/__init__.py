"""What batchd's tests and benchmarks run on: a real Kubernetes cluster and real servers.

Dev only: installed (editable, from a checkout) by `make install`, never into an image.
`kubernetes` is the test cluster (a control plane and nodes built from Kubernetes' Go modules, the
chart installed with Helm, the router on a node-less API server), `pods` how controllers read a
Pod, `schemas` the built-in kinds' schemas of every supported Kubernetes version, `traffic`
open-loop load over a Service's endpoints, `servers` real replicas, the router and uvicorn on
this machine, `prometheus` a real Prometheus, `promtext` a server's `/metrics` text read back,
`asgi` what plain ASGI stand-ins share, `helm` the chart through the real Helm library,
`models` MiniLM from disk and tiny transformers models built here, `batch_handlers` the models'
batch handlers that fail, stall or count on purpose, `waiting` bounded polls.
"""

from pathlib import Path

# The checkout this package was installed from (editable): the chart, the examples and the
# committed CRD live there, not in any installed package.
ROOT = Path(__file__).resolve().parents[5]
