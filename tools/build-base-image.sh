#!/usr/bin/env bash
# The base batchd's images are built on here (the Dockerfile's PYTHON_IMAGE): Debian bookworm made
# with debootstrap, since no registry is reached from this machine, and Debian's Python in a venv
# first on PATH, so that `python` and `pip` are what the default python:3.11-slim base gives. pip
# is told this machine's CA bundle, which the package index is reached through.
#
# Prints the image's name, building it only if it is new. The name is the hash of what makes its
# content: the recipe below and the CA bundle.
set -euo pipefail

SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates
VENV=/opt/python
ENV=("PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
     "PIP_CERT=/etc/ssl/certs/batchd-build-ca.crt" "LANG=C.UTF-8")

key=$( { echo "$SUITE $PACKAGES $VENV ${ENV[*]}"; cat /etc/ssl/certs/ca-certificates.crt; } | sha256sum | cut -c1-16)
BASE=localhost/batchd-base:$key
if buildah inspect --type image "$BASE" >/dev/null 2>&1; then echo "$BASE"; exit 0; fi
command -v debootstrap >/dev/null || { echo "build-base-image: debootstrap is needed (make tools)" >&2; exit 1; }

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" >&2
chroot "$rootfs" python3 -m venv "$VENV"
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/batchd-build-ca.crt"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
container=$(buildah from scratch)
buildah copy "$container" "$rootfs" / >/dev/null
buildah config "${ENV[@]/#/--env=}" "$container"
buildah commit -q "$container" "$BASE" >/dev/null
buildah rm "$container" >/dev/null
# Earlier bases are never used again.
buildah images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/batchd-base:' | grep -v ":$key\$" \
  | xargs -r buildah rmi >/dev/null || true
echo "$BASE"
