#!/usr/bin/env bash
# Builds helm (for the chart's lint and render checks) from the Go module proxy into the tool cache,
# ${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/tools/helm-<version>/helm, once; a second run only checks that it
# is there. The build goes to a temporary directory renamed into place, so an interrupted one leaves nothing
# that looks finished. Prints the binary's path as its last line.
set -euo pipefail
version=v3.22.0   # tests/cluster/test_helm.py reads the binary from the same place
dir="${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/tools/helm-$version"
if [ ! -x "$dir/helm" ]; then
  command -v go >/dev/null || { echo "helm: Go is needed to build helm $version" >&2; exit 1; }
  mkdir -p "$(dirname "$dir")"
  tmp=$(mktemp -d "$dir.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  start=$(date +%s)
  echo "helm: building helm $version with $(go version | cut -d' ' -f3)"
  GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-mod=mod go install -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w" \
    "helm.sh/helm/v3/cmd/helm@$version"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  echo "helm: built in $(( $(date +%s) - start ))s"
fi
echo "helm: $("$dir/helm" version --short)"
echo "$dir/helm"
