#!/usr/bin/env bash
# Builds the NetworkPolicy enforcer of the end-to-end tests: kube-router's policy controller
# (iptables and ipset rules from the cluster's NetworkPolicies), from its Go module. The test node
# runs it with `--run-firewall` alone; the node's bridge CNI and kube-proxy stay as they are.
#
# A test part only: v2.1.0 is the one version the module proxy serves here, and security flaws are
# reported for it, so it never goes into an image or a chart.
# Built as every test part from a Go module is (tools/go-binary.sh).
#
#   tools/build-kube-router.sh        build (or reuse) and print the path of the binary
set -euo pipefail

KUBE_ROUTER_VERSION=${KUBE_ROUTER_VERSION:-v2.1.0}
source "$(dirname "$0")/go-binary.sh"
go_binary kube-router github.com/cloudnativelabs/kube-router/v2 "$KUBE_ROUTER_VERSION" ./cmd/kube-router --version
