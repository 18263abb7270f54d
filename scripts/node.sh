#!/usr/bin/env bash
# What the test node needs besides the control plane: Debian's containerd, runc, CNI plugins and busybox-static
# (installed with apt-get when missing), and the pod sandbox image localhost/vramguard-pause, built from
# testbed/src/vramguard_testbed/pause.c (no registry is reachable) into the image cache as an OCI archive.
# Run as root. Prints the image cache directory as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt.sh
cache="${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/images"
pause_version=1  # bump when pause.c changes

missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v busybox >/dev/null || missing+=(busybox-static)
command -v buildah >/dev/null || missing+=(buildah)
[ ${#missing[@]} -eq 0 ] || apt_install node "${missing[@]}"
echo "node: $(containerd --version | cut -d' ' -f2-3), $(runc --version | head -n1)"

archive="$cache/pause-$pause_version.tar"
if [ ! -f "$archive" ]; then
  mkdir -p "$cache"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "${CC:-cc}" -static -O2 -o "$work/pause" testbed/src/vramguard_testbed/pause.c
  ctr=$(buildah from scratch)
  buildah copy "$ctr" "$work/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
  buildah commit -q "$ctr" "localhost/vramguard-pause:$pause_version" >/dev/null
  buildah rm "$ctr" >/dev/null
  buildah push -q "localhost/vramguard-pause:$pause_version" \
    "oci-archive:$archive.tmp:localhost/vramguard-pause:$pause_version" >/dev/null
  mv "$archive.tmp" "$archive"
  echo "node: built localhost/vramguard-pause:$pause_version"
fi
echo "$cache"
