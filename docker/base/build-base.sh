#!/usr/bin/env bash
# Build the local stand-in for python:3.11-slim-bookworm: Debian bookworm (minbase, debootstrap)
# with Debian's own python3, imported into the local image store as $BASE_IMAGE.
#
#   docker/base/build-base.sh [BASE_IMAGE]      (root; needs debootstrap and podman)
#
# Used where no container registry can be reached. The debootstrapped tree is cached as a
# tarball in $AGENTMESH_IMAGE_CACHE (default ~/.cache/agentmesh/images), so a second build on
# the same machine skips debootstrap, and an image already in the store is kept as it is.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # debootstrap
BASE_IMAGE=${1:-localhost/agentmesh-base:bookworm}
CACHE=${AGENTMESH_IMAGE_CACHE:-${HOME:-/root}/.cache/agentmesh/images}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PODMAN=${PODMAN:-podman}
# What both Dockerfiles expect of their base (python:3.11-slim-bookworm has the same): a python3
# that can make a venv, and CA certificates.
PACKAGES=python3,python3-venv,ca-certificates
TARBALL="$CACHE/bookworm-minbase-python3.tar"

if $PODMAN image exists "$BASE_IMAGE"; then
  echo "base image $BASE_IMAGE: already built"
  exit 0
fi

mkdir -p "$CACHE"
if [ ! -s "$TARBALL" ]; then
  root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  echo "debootstrap bookworm ($PACKAGES) into $root"
  debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
    || { tail -n 30 "$CACHE/debootstrap.log" >&2; exit 1; }
  # What an image needs no copy of: package lists, caches, logs, documentation.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
         "$root"/var/log/* "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
  tar -C "$root" --numeric-owner -cf "$TARBALL.part" .
  mv "$TARBALL.part" "$TARBALL"
fi

$PODMAN import --quiet \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  "$TARBALL" "$BASE_IMAGE" > /dev/null
echo "base image $BASE_IMAGE: imported from $TARBALL"
