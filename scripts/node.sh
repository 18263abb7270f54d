#!/usr/bin/env bash
# What the test node needs besides the control plane: Debian's containerd, runc, CNI plugins and busybox-static
# (installed with apt-get when missing), and two images as OCI archives in the image cache (no registry is
# reachable): the pod sandbox image localhost/vramguard-pause, built from testbed/src/vramguard_testbed/pause.c,
# and the workload image localhost/vramguard-workload (Debian's static busybox: sh and sleep), which the tests'
# GPU pods run. Run as root. Prints the image cache directory as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt.sh
cache="${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/images"
pause_version=1  # bump when pause.c changes
workload_version=1  # bump when the workload image's recipe below changes

missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v busybox >/dev/null || missing+=(busybox-static)
command -v buildah >/dev/null || missing+=(buildah)
[ ${#missing[@]} -eq 0 ] || apt_install node "${missing[@]}"
echo "node: $(containerd --version | cut -d' ' -f2-3), $(runc --version | head -n1)"

# build_image NAME VERSION DIR ENTRYPOINT [USER]: an image of DIR's files (ENTRYPOINT in JSON), saved as an
# archive.
build_image() {
  local name=$1 version=$2 dir=$3 entrypoint=$4 user=${5:-} ctr
  local archive="$cache/$name-$version.tar" ref="localhost/vramguard-$name:$version"
  ctr=$(buildah from scratch)
  buildah copy "$ctr" "$dir" / >/dev/null
  buildah config --entrypoint "$entrypoint" "$ctr"
  [ -z "$user" ] || buildah config --user "$user" "$ctr"
  buildah commit -q "$ctr" "$ref" >/dev/null
  buildah rm "$ctr" >/dev/null
  buildah push -q "$ref" "oci-archive:$archive.tmp:$ref" >/dev/null
  mv "$archive.tmp" "$archive"
  echo "node: built $ref"
}

mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ ! -f "$cache/pause-$pause_version.tar" ]; then
  mkdir "$work/pause"
  "${CC:-cc}" -static -O2 -o "$work/pause/pause" testbed/src/vramguard_testbed/pause.c
  build_image pause "$pause_version" "$work/pause" '["/pause"]' 65535:65535
fi
if [ ! -f "$cache/workload-$workload_version.tar" ]; then
  mkdir -p "$work/workload/bin"
  cp "$(command -v busybox)" "$work/workload/bin/busybox"
  for applet in sh sleep cat ls; do ln -s busybox "$work/workload/bin/$applet"; done
  build_image workload "$workload_version" "$work/workload" '["/bin/sleep", "1000000"]'
fi
echo "$cache"
