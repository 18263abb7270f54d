#!/usr/bin/env bash
# Installs, in one apt-get run, the Debian packages the test command's real parts need and this machine lacks:
# etcd for the control plane (scripts/controlplane.sh), containerd, runc, the CNI plugins and busybox for the test
# node (scripts/node.sh), buildah and debootstrap for the images (scripts/image.sh, scripts/node.sh). Each of those
# scripts still installs what it needs when run alone; the test command runs this first because its builds then
# run side by side, and two apt-get runs at once would fight over dpkg's lock.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt.sh
missing=()
command -v etcd >/dev/null || missing+=(etcd-server)
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v busybox >/dev/null || missing+=(busybox-static)
command -v buildah >/dev/null || missing+=(buildah)
command -v debootstrap >/dev/null || missing+=(debootstrap)
[ ${#missing[@]} -eq 0 ] || apt_install packages "${missing[@]}"
