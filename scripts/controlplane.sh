#!/usr/bin/env bash
# Builds the Kubernetes versions the integration tests run, one per hack/k8s/<version>/go.mod (the newest and the
# oldest the README claims): the control plane (kube-apiserver, kube-scheduler, kube-controller-manager) of each,
# and for the newest also the test node's kubelet and kubectl (the real node runs only the newest, and each
# binary costs minutes on 2 cores); and installs Debian's etcd when it is missing. The newest's module also pins
# helm and Prometheus, which scripts/helm.sh and scripts/prometheus.sh build from it (scripts/gobuild.sh).
#
#   bash scripts/controlplane.sh            # every version under hack/k8s/
#   bash scripts/controlplane.sh v1.37      # one
#
# Binaries go to ${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/k8s/<version>/, outside the repo, keyed by the
# k8s.io/kubernetes version pinned in the go.mod; tests/cluster/controlplane.py find_binaries() reads the
# same path. Only missing binaries are built (all of them again when go.mod, go.sum or Go changed: a stamp beside
# them, scripts/gobuild.sh), into a temporary directory beside the cache and renamed into place
# afterwards, so an interrupted build never leaves a file that looks finished. A second run only checks that the
# files exist.
#
# Prints each binaries directory on a line of its own, last.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt.sh
source scripts/gobuild.sh


now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

build_version() {
  local module_dir=$1 version bin_dir tmp_dir minor build_date ldflags start end name stamp
  local binaries=(kube-apiserver kube-scheduler kube-controller-manager) missing=() pkgs=()
  [ "$module_dir" = "$newest" ] && binaries+=(kubelet kubectl)
  version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 } $1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2 }' \
    "$module_dir/go.mod" | head -n1)
  if [ -z "$version" ]; then
    echo "controlplane: no k8s.io/kubernetes version in $module_dir/go.mod" >&2
    exit 1
  fi
  bin_dir="${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/k8s/$version"
  stamp=$(module_stamp "$module_dir")
  for name in "${binaries[@]}"; do
    if ! stamped "$bin_dir" "$stamp"; then
      missing+=("$name")  # built from another go.mod or go.sum, or with another Go: all again
    elif [ ! -x "$bin_dir/$name" ]; then
      missing+=("$name")
    fi
  done

  if [ ${#missing[@]} -eq 0 ]; then
    echo "controlplane: kubernetes $version binaries present, nothing to build"
  else
    command -v go >/dev/null || { echo "controlplane: Go is needed to build ${missing[*]}" >&2; exit 1; }
    mkdir -p "$bin_dir"
    tmp_dir=$(mktemp -d "$bin_dir/.build.XXXXXX")
    trap 'rm -rf "$tmp_dir"' EXIT
    trap 'exit 130' INT TERM  # so that the EXIT trap runs when interrupted

    minor=${version#v1.}
    minor=${minor%%.*}
    # Without these the binaries report v0.0.0, which clients and discovery treat as a broken server.
    # The build date is the tag's publication time, so two builds of one version are identical.
    build_date=$(module_time "$module_dir" k8s.io/kubernetes 2006-01-02T15:04:05Z)
    ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
      ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
    done

    for name in "${missing[@]}"; do
      pkgs+=("k8s.io/kubernetes/cmd/$name")
    done
    echo "controlplane: building ${missing[*]} (kubernetes $version) with $(go version | cut -d' ' -f3)"
    start=$(now)
    # One invocation for all of them: the packages they share (most of the apiserver stack) compile once.
    go_build "$module_dir" "$tmp_dir" "$ldflags" "${pkgs[@]}"
    end=$(now)
    stamped "$bin_dir" "$stamp" || rm -f "$bin_dir/.module" "${binaries[@]/#/$bin_dir/}"
    for name in "${missing[@]}"; do
      mv -f "$tmp_dir/$name" "$bin_dir/$name"
    done
    echo "$stamp" >"$bin_dir/.module"
    rm -rf "$tmp_dir"
    trap - EXIT INT TERM
    echo "controlplane: built ${missing[*]} in $(elapsed "$start" "$end")s"
  fi

  for name in "${binaries[@]}"; do
    if [ "$name" = kubectl ]; then
      echo "controlplane: kubectl $("$bin_dir/$name" version --client 2>&1 | head -n1)"
    else
      echo "controlplane: $("$bin_dir/$name" --version 2>&1 | head -n1) ($name)"
    fi
  done
  built_dirs+=("$bin_dir")
}

built_dirs=()
newest=$(newest_module)
if [ $# -eq 0 ]; then
  set -- hack/k8s/*/
else
  set -- "${@/#/hack/k8s/}"
fi
for module_dir in "$@"; do
  build_version "${module_dir%/}"
done
# etcd: Debian's etcd-server (3.4 on bookworm) serves kube-apiserver's etcd clients (3.5, 3.6) fine. After the
# build: the test command starts this script while its own apt-get run may still hold dpkg's lock.
command -v etcd >/dev/null || apt_install controlplane etcd-server
echo "controlplane: $(etcd --version | head -n1)"
printf '%s\n' "${built_dirs[@]}"
