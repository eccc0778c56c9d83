#!/usr/bin/env bash
# Runs a command in a network namespace of its own, as root there and nowhere else: the tests'
# control plane adds its address (198.18.250.x) to that namespace's loopback, never to this
# machine's, and a user who is not root gets a user namespace that maps them to root inside it.
# Nothing in it reaches another network: what runs there (etcd, the API server, the router, the
# replicas) talks over its loopback only. Nodes cannot run in it (they need this machine's
# cgroups): `make test-fast` runs here, `make test` as root.
#
#   tools/own-network.sh .venv/bin/python -m pytest -m "not slow"
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
if [ "$(id -u)" = 0 ]; then namespaces=(--net); else namespaces=(--user --map-root-user --net); fi
exec unshare "${namespaces[@]}" -- bash -c 'ip link set lo up && exec "$@"' own-network "$@"
