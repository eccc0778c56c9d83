"""A real Kubernetes for the end-to-end tests, built from its Go modules (`tools/build-kubernetes.sh`).

`toolchain` finds the binaries, `pki` makes the cluster's certificates, `controlplane` runs etcd,
the API server, the controller manager and the scheduler on loopback, `components` runs batchd's
operator and router as the chart deploys them, each with its own ServiceAccount's token, and
`fixtures` is the pytest plugin that starts one control plane per test session and worker.
"""
