#!/usr/bin/env bash
# Builds one binary of a Go module at a version, as its own main module (from the go.mod and
# go.sum it was released with), into a folder named by the version under ~/.cache/batchd
# (BATCHD_CACHE), outside the checkout, reusing Go's module and build caches; the folder is used
# only once its build finished (`.complete`), and only once the binary ran its VERSION_ARGS (which
# must succeed: a build that cannot say its version is no build). Prints the binary's path.
# Sourced by the tools/build-*.sh of the test parts built from Go modules.
#
#   go_binary NAME MODULE VERSION PACKAGE VERSION_ARGS [LDFLAGS]
set -euo pipefail

go_binary() {
  local name=$1 module=$2 version=$3 package=$4 check=$5 ldflags=${6:-"-s -w"}
  local cache=${BATCHD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchd}
  local out=$cache/$name-$version
  local bin=$out/bin
  if [ -f "$out/.complete" ]; then echo "$bin/$name"; return 0; fi
  # One build of a folder at a time on this machine (two test workers, two checkouts): the second
  # waits, then finds it complete.
  mkdir -p "$cache"
  exec 8>"$out.lock"
  flock 8
  if [ -f "$out/.complete" ]; then echo "$bin/$name"; return 0; fi
  command -v go >/dev/null || { echo "build-$name: Go is needed (go.dev/doc/install)" >&2; return 1; }
  mkdir -p "$bin"
  # The module's source in Go's module cache (read-only: the build writes only the binary).
  local src
  src=$(cd "$(mktemp -d)" && CGO_ENABLED=0 go mod download -json "$module@$version" \
    | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "$ldflags" -o "$bin/$name" "$package")
  "$bin/$name" $check >&2
  touch "$out/.complete"
  echo "$bin/$name"
}
