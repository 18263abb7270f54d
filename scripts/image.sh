#!/usr/bin/env bash
# Builds the agent's image from the Dockerfile with buildah (no Docker engine needed), as an OCI archive in the
# image cache (${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/images/vramguard-<version>.tar) and as
# localhost/vramguard:<version> in buildah's local storage. Run as root.
#
# Public base images cannot be pulled everywhere, so the Dockerfile's base is an argument (PYTHON): where no
# registry is reachable this script first makes one, localhost/vramguard-python-base, from Debian's own packages
# (debootstrap: python3 and pip, trimmed; built once, then kept in buildah's storage). With a reachable registry,
# `BASE=python:3.11.11-slim-bookworm bash scripts/image.sh` builds on the public base instead. Prints the image's
# name and size as its last lines.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt.sh
version=$(awk -F'"' '/^version = / { print $2; exit }' pyproject.toml)
cache="${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/images"
recipe=1  # bump when the base recipe below changes
base=${BASE:-localhost/vramguard-python-base:bookworm-$recipe}
image=localhost/vramguard:$version
mirror=${VRAMGUARD_DEBIAN_MIRROR:-http://deb.debian.org/debian}

missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v debootstrap >/dev/null || missing+=(debootstrap)
[ ${#missing[@]} -eq 0 ] || apt_install image "${missing[@]}"

if [ -z "${BASE:-}" ] && ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  start=$(date +%s)
  rootfs=$(mktemp -d /tmp/vramguard-base.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  echo "image: making $base from Debian packages ($mirror)"
  debootstrap --variant=minbase --include=python3,python3-pip bookworm "$rootfs" "$mirror" >/dev/null
  # Like the public python images: pip may install into the system, `python` is python3, no docs or caches.
  rm -f "$rootfs"/usr/lib/python3.*/EXTERNALLY-MANAGED
  ln -sf python3 "$rootfs/usr/bin/python"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  cp -a "$rootfs"/. "$mnt"/
  buildah umount "$ctr" >/dev/null
  buildah config --env LANG=C.UTF-8 --env PYTHONDONTWRITEBYTECODE=1 --cmd python3 "$ctr"
  buildah commit -q "$ctr" "$base" >/dev/null
  buildah rm "$ctr" >/dev/null
  echo "image: base made in $(( $(date +%s) - start ))s"
fi

# pip in the build stage reaches PyPI; where TLS goes through a proxy with its own CA, the host's bundle is lent
# to the build (a bind mount while RUN runs, never part of the image).
mounts=()
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mounts=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
fi
start=$(date +%s)
buildah bud -q --isolation chroot "${mounts[@]}" --build-arg "PYTHON=$base" -t "$image" . >/dev/null
# The previous build of the same tag is left untagged: remove it (and any other dangling image) so that the
# storage does not grow by an image per run.
buildah rmi --prune >/dev/null 2>&1 || true
mkdir -p "$cache"
# Written beside and renamed into place: a run that loads the image meanwhile (another checkout's tests) reads the
# old archive or the new one whole, never a missing or half-written one.
partial="$cache/.vramguard-$version.tar.$$"
rm -f "$partial"
buildah push -q "$image" "oci-archive:$partial:$image" >/dev/null
mv -f "$partial" "$cache/vramguard-$version.tar"
echo "image: built in $(( $(date +%s) - start ))s on $base"
echo "image: $cache/vramguard-$version.tar ($(du -m "$cache/vramguard-$version.tar" | cut -f1) MiB compressed)"
echo "$image"
