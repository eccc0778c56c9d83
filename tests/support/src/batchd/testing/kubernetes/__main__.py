"""`python -m batchd.testing.kubernetes`: start the test cluster (a control plane and a node, batchd's
images loaded), report how long each part took, and either stop or keep it running for a person to
use with the printed kubeconfig until Ctrl-C.

    python -m batchd.testing.kubernetes --repeats 3    the timings of 3 starts, then their medians
    python -m batchd.testing.kubernetes --keep          a cluster to poke at (kubectl, helm)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from batchd.testing.kubernetes import image_store
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.dns import start_dns
from batchd.testing.kubernetes.images import build_images
from batchd.testing.kubernetes.network import ClusterAddresses
from batchd.testing.kubernetes.node import Node

# A pod as small as a pod gets: the sandbox and one container, from an image the node holds.
PROBE_POD = """
apiVersion: v1
kind: Pod
metadata: {name: probe}
spec:
  containers:
    - name: probe
      image: ghcr.io/batchd/batchd-router:{version}
      command: ["python", "-c", "import time; time.sleep(3600)"]
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
        runAsNonRoot: true
        seccompProfile: {type: RuntimeDefault}
"""


def start_once(directory: Path, slot: int, keep: bool) -> dict[str, float]:
    timings: dict[str, float] = {}
    with ControlPlane(directory / "control-plane", ClusterAddresses(slot)) as cluster:
        timings["control_plane_start_s"] = cluster.start_seconds
        started = time.monotonic()
        start_dns(cluster)
        timings["dns_start_s"] = time.monotonic() - started
        started = time.monotonic()
        images = build_images()
        imported = image_store.update(images)
        timings["images_ready_s"] = time.monotonic() - started
        timings["images_imported"] = len(imported)
        with Node(cluster, cluster.addresses.node(0), directory / "node") as node:
            timings["node_start_s"] = node.start_seconds
            version = images[0].ref.rsplit(":", 1)[1]
            started = time.monotonic()
            cluster.kubectl(
                "apply", "-n", "default", "-f", "-", input=PROBE_POD.replace("{version}", version)
            )
            cluster.kubectl("wait", "-n", "default", "--for=condition=Ready", "pod/probe", "--timeout=120s")
            timings["pod_create_to_ready_s"] = time.monotonic() - started
            if keep:
                print(f"export KUBECONFIG={cluster.admin_kubeconfig}  # Ctrl-C stops the cluster", flush=True)
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    pass
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--slot", type=int, default=20, help="the address slot (tests use 0 and up)")
    parser.add_argument("--keep", action="store_true", help="keep the cluster running until Ctrl-C")
    options = parser.parse_args()
    runs = []
    for _ in range(options.repeats):
        with tempfile.TemporaryDirectory(prefix="batchd-cluster-") as directory:
            runs.append(start_once(Path(directory), options.slot, options.keep))
            print(json.dumps(runs[-1]), flush=True)
    if options.repeats > 1:
        medians = {key: round(statistics.median(run[key] for run in runs), 2) for key in runs[0]}
        print(json.dumps({"medians": medians}))


if __name__ == "__main__":
    main()
