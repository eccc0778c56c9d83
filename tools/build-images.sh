#!/usr/bin/env bash
# Builds batchd's three images (operator, router, replica) from the project's own Dockerfile with
# buildah, on a Debian base made here with debootstrap (no registry is reached from this machine),
# and writes each as an OCI archive that a node's containerd imports.
#
# Each build is cached by its inputs: an image by the Dockerfile, the files its build stage copies
# and the base (tools/build-base-image.sh). Only a change to those builds again.
#
#   tools/build-images.sh [operator|router|replica|pause ...]   build (or reuse); print "TARGET ARCHIVE REF"
#   lines (default: all four)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${BATCHD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchd}
OUT=$CACHE/images
VERSION=$(cat "$root/VERSION")
REGISTRY=${REGISTRY:-ghcr.io/batchd}
mkdir -p "$OUT"
# One build at a time on this machine: two test workers that both find an image missing (its
# inputs changed) would otherwise write the same archive at once; the second waits, then reuses it.
exec 9>"$OUT/.build.lock"
flock 9
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(operator router replica pause)

command -v buildah >/dev/null || { echo "build-images: buildah is needed (make tools)" >&2; exit 1; }

hash_of() { sha256sum | cut -c1-16; }

# The base, made by its own script and named by its content's recipe.
BASE=$("$root/tools/build-base-image.sh")
base_key=${BASE##*:}

# What an image holds: the base, the Dockerfile, and the projects it installs (a change to the
# operator's code builds the operator again, not the replica's torch).
declare -A PROJECTS=([operator]="api operator" [router]="api router" [replica]="api replica examples")
inputs_key() {
  (cd "$root" && { echo "$base_key"; cat Dockerfile VERSION;
    git ls-files -co --exclude-standard ${PROJECTS[$1]} | LC_ALL=C sort | xargs sha256sum; } | hash_of)
}

# The pod sandbox image (what containerd's sandbox_image names): the pause program built with the
# Kubernetes toolchain (tools/build-kubernetes.sh), alone in an image.
pause_image() {
  local pause ref=localhost/batchd-pause:3.10
  pause=$("$root/tools/build-kubernetes.sh")/pause
  local archive=$OUT/pause-$(hash_of < "$pause").tar
  if [ ! -f "$archive" ]; then
    local container
    container=$(buildah from scratch)
    buildah copy "$container" "$pause" /pause >/dev/null
    buildah config --entrypoint '["/pause"]' --user 65535:65535 "$container"
    buildah commit -q "$container" "$ref" >/dev/null
    buildah rm "$container" >/dev/null
    rm -f "$OUT"/pause-*.tar
    buildah push -q "$ref" "oci-archive:$archive.partial:$ref" >&2
    mv "$archive.partial" "$archive"
  fi
  echo "pause $archive $ref"
}

for target in "${targets[@]}"; do
  if [ "$target" = pause ]; then pause_image; continue; fi
  ref=$REGISTRY/batchd-$target:$VERSION
  [ -n "${PROJECTS[$target]:-}" ] || { echo "build-images: no target $target" >&2; exit 2; }
  archive=$OUT/$target-$(inputs_key "$target").tar
  if [ ! -f "$archive" ]; then
    # Each RUN step runs in a chroot: this machine cannot make the namespaces `--isolation oci`
    # needs. No --layers: buildah 1.28 then breaks `RUN --mount=type=bind,from=build`.
    buildah bud -q --isolation chroot --target "$target" --build-arg "PYTHON_IMAGE=$BASE" \
      --build-arg "VERSION=$VERSION" -t "$ref" -f "$root/Dockerfile" "$root" >&2
    buildah push -q "$ref" "oci-archive:$archive.partial:$ref" >&2
    mv "$archive.partial" "$archive"
    buildah rmi -f "$ref" >/dev/null 2>&1 || true
    # The two newest of a target stay: two checkouts on one machine (a branch beside main) then
    # take turns without a rebuild each time, and the replica's GBs never pile up.
    ls -t "$OUT/$target"-*.tar | tail -n +3 | xargs -r rm -f
  fi
  echo "$target $archive $ref"
done
