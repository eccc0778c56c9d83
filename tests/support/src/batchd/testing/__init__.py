"""What batchd's tests and benchmarks run on: the stand-in cluster and real servers on loopback.

Dev only: installed (editable, from a checkout) by `make install`, never into an image.
`apiserver` is the emulated Kubernetes API server (KMock, taught the API server's rules),
`admission` its CRD validation, `cluster` the stand-in for the kubelet, kube-proxy and the
Deployment and EndpointSlice controllers (real `batchd serve` processes for the pods;
`endpointslices` decides what a Service's slices hold, `pods` how controllers read a Pod),
`traffic` open-loop load over a Service's endpoints, `operator_runner` the real Kopf operator
against it, `servers` real replicas, the router and uvicorn on loopback, `prometheus` a real
Prometheus, `helm` the chart through the real Helm library, `models` MiniLM from disk and tiny
transformers models built here, `batch_handlers` the models' batch handlers that fail, stall or
count on purpose.
"""

from pathlib import Path

# The checkout this package was installed from (editable): the chart, the examples and the
# committed CRD live there, not in any installed package.
ROOT = Path(__file__).resolve().parents[5]
