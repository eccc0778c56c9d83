#!/usr/bin/env bash
# Builds the real Kubernetes the end-to-end tests run on, from Go modules: etcd, the control plane
# (kube-apiserver, kube-controller-manager, kube-scheduler), the node (kubelet, kube-proxy),
# kubectl, helm, CoreDNS, and the pause image's program from the same k8s.io/kubernetes module.
#
# Everything lands in one folder named by the versions, outside the checkout, so a fresh clone on
# the same machine (CI's) reuses it, as it reuses Go's module and build caches. A folder is used
# only once its build finished: the last step writes `.complete`.
#
#   tools/build-kubernetes.sh            build (or reuse) and print the bin folder
#   KUBERNETES_VERSION=v1.33.9 tools/build-kubernetes.sh    another minor of the supported range
set -euo pipefail

KUBERNETES_VERSION=${KUBERNETES_VERSION:-v1.35.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.14}
HELM_VERSION=${HELM_VERSION:-v3.19.5}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.7}
CACHE=${BATCHD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchd}
OUT=$CACHE/kubernetes-$KUBERNETES_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION-coredns-$COREDNS_VERSION
BIN=$OUT/bin

if [ -f "$OUT/.complete" ]; then echo "$BIN"; exit 0; fi
# One build of a folder at a time on this machine (two test workers, two checkouts): the second
# waits, then finds it complete.
mkdir -p "$CACHE"
exec 9>"$OUT.lock"
flock 9
if [ -f "$OUT/.complete" ]; then echo "$BIN"; exit 0; fi
command -v go >/dev/null || { echo "build-kubernetes: Go is needed (go.dev/doc/install)" >&2; exit 1; }
mkdir -p "$BIN"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# A module that requires $2@$3 and replaces each of that module's own `replace => ./local` lines with
# the published module at the matching version ($4, a sed expression mapping the version), so that
# `go build` can build the main packages named after it. The replace block is generated from the
# module's own go.mod, never written by hand.
make_module() {
  local dir=$1 module=$2 version=$3 map=$4
  shift 4
  mkdir -p "$dir"
  local gomod go_line
  gomod=$(cd "$dir" && go mod download -json "$module@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  go_line=$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$gomod")
  {
    echo "module batchd.dev/build/$(basename "$dir")"
    echo "go $go_line"
    echo "require $module $version"
    go mod edit -json "$gomod" | python3 -c '
import json, subprocess, sys
version = subprocess.run(["sed", sys.argv[1]], input=sys.argv[2], capture_output=True, text=True, check=True).stdout.strip()
mod = json.load(sys.stdin)
required = {r["Path"] for r in mod.get("Require") or []}
for r in mod.get("Replace") or []:
    old = r["Old"]["Path"]
    # A local path the module requires is a sibling module published at the same release; other
    # local replaces (etcd'"'"'s FORBIDDEN_DEPENDENCY) only guard against imports.
    if r["New"]["Path"].startswith(".") and old in required:
        print("replace", old, "=>", old, version)
' "$map" "$version"
  } > "$dir/go.mod"
  # The packages to build, imported so that `go mod tidy` keeps what they need.
  { echo "//go:build tools"; echo; echo "package tools"; echo; echo "import ("
    for pkg in "$@"; do echo "	_ \"$pkg\""; done; echo ")"; } > "$dir/tools.go"
  (cd "$dir" && go mod tidy)
}

# k8s.io/kubernetes: its staging modules k8s.io/X are published at v0.<minor>.<patch>.
K8S_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
k8s_packages=("${K8S_COMMANDS[@]/#/k8s.io/kubernetes/cmd/}")
make_module "$work/kubernetes" k8s.io/kubernetes "$KUBERNETES_VERSION" 's/^v1\./v0./' "${k8s_packages[@]}"
minor=$(echo "$KUBERNETES_VERSION" | sed 's/^v1\.\([0-9]*\)\..*/\1/')
# What `kubectl version` and the API server's /version report (hack/lib/version.sh sets the same).
ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
(cd "$work/kubernetes" && go build -trimpath -ldflags "$ldflags" -o "$BIN/" "${k8s_packages[@]}")

# The pod sandbox (pause) image's program: no registry is reached, so it is built from the source
# the Kubernetes module ships.
src=$(cd "$work/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
cc -Os -static -o "$BIN/pause" -DVERSION="$KUBERNETES_VERSION" "$src/build/pause/linux/pause.c"

# etcd: its server module's sibling modules are published at the same version.
make_module "$work/etcd" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" 's/^//' go.etcd.io/etcd/server/v3
(cd "$work/etcd" && go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3)

make_module "$work/helm" helm.sh/helm/v3 "$HELM_VERSION" 's/^//' helm.sh/helm/v3/cmd/helm
(cd "$work/helm" && go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
  -o "$BIN/helm" helm.sh/helm/v3/cmd/helm)

# The cluster's DNS (pods find the API server and each other's Services by name).
make_module "$work/coredns" github.com/coredns/coredns "$COREDNS_VERSION" 's/^//' github.com/coredns/coredns
(cd "$work/coredns" && go build -trimpath -ldflags "-s -w" -o "$BIN/coredns" github.com/coredns/coredns)

"$BIN/kubectl" version --client >&2
touch "$OUT/.complete"
echo "$BIN"
