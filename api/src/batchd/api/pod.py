"""What the operator, the replica image and the Helm chart must agree on about a replica pod.

Each fact lives here once. The Dockerfile and the chart cannot import Python, so
`tests/test_agreement.py` reads them and fails when they say something else.
"""

from __future__ import annotations

# The port a replica serves inference, health and /metrics on (container port named "http").
REPLICA_PORT = 8000
# The non-root UID and GID the replica and operator images run as.
RUNTIME_UID = 10001
# Where the operator mounts the replica's manifest, and where `batchd serve` reads it in a pod.
CONFIG_DIR = "/etc/batchd"
CONFIG_KEY = "manifest.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
# Every child the operator makes carries this label; its watches select on it.
MANAGED_BY = {"app.kubernetes.io/managed-by": "batchd"}
# The images a release ships, without their tag (the tag is the version).
OPERATOR_IMAGE = "ghcr.io/batchd/batchd-operator"
REPLICA_IMAGE = "ghcr.io/batchd/batchd-replica"
ROUTER_IMAGE = "ghcr.io/batchd/batchd-router"

# Every replica pod, stable or canary, carries this label (the operator's pod watch selects on it).
REPLICA_APP = {"app.kubernetes.io/name": "batchd-replica"}
# The replica pods' component label (the operator's pod template; the router's EndpointSlice watch).
REPLICA_COMPONENT = {"app.kubernetes.io/component": "replica"}
# A canary revision's pods and Service have this component instead: the stable Service, which
# selects `replica`, never reaches them.
CANARY_COMPONENT = {"app.kubernetes.io/component": "canary"}
# The port the router serves clients, GET /held, health and /metrics on (container port named "http").
ROUTER_PORT = 8080
# The router pods' component label (the chart's template): the operator finds them by it.
ROUTER_COMPONENT = {"app.kubernetes.io/component": "router"}
