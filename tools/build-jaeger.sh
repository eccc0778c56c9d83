#!/usr/bin/env bash
# Builds the real trace backend the tracing tests and benchmark export to: Jaeger (its v2 binary,
# an OpenTelemetry Collector with Jaeger's storage and query extensions), from its Go module, with
# its OTLP receivers, the in-memory store and the query API.
#
# As the Kubernetes binaries (tools/build-kubernetes.sh), it lands in a folder named by the version
# under ~/.cache/batchd (BATCHD_CACHE), outside the checkout, and reuses Go's module and build
# caches; the folder is used only once its build finished (`.complete`). Jaeger is built as its own
# main module, from the go.mod and go.sum it was released with, so its pins (and its one `replace`)
# are the release's own.
#
# The Go module carries no UI assets (they are built from jaeger-ui with npm): this binary serves
# the query API and a placeholder page where the UI would be. Jaeger's own image serves the UI.
#
#   tools/build-jaeger.sh          build (or reuse) and print the path of the binary
set -euo pipefail

JAEGER_VERSION=${JAEGER_VERSION:-v1.76.0}
source "$(dirname "$0")/go-binary.sh"
# What `jaeger version` and the query API's /api/version report (Jaeger's Makefile sets the same).
ldflags="-s -w -X github.com/jaegertracing/jaeger/internal/version.latestVersion=$JAEGER_VERSION"
go_binary jaeger github.com/jaegertracing/jaeger "$JAEGER_VERSION" ./cmd/jaeger version "$ldflags"
