#!/usr/bin/env bash
# Builds helm (for the chart's lint and render checks) from the newest Kubernetes' module
# (hack/k8s/<newest>/go.mod pins it beside Kubernetes: scripts/gobuild.sh says why) into the tool cache,
# ${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/tools/helm-<version>/helm, once; a second run only checks that it is
# there. The build goes to a temporary directory renamed into place, so an interrupted one leaves nothing that looks
# finished. Prints the binary's path as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gobuild.sh
module=$(newest_module)
version=$(awk '$1 == "helm.sh/helm/v3" { print $2 }' "$module/go.mod")  # tests/helm_fixtures.py HELM_VERSION
dir="${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/tools/helm-$version"
stamp=$(module_stamp "$module")
if [ ! -x "$dir/helm" ] || ! stamped "$dir" "$stamp"; then
  mkdir -p "$(dirname "$dir")"
  tmp=$(mktemp -d "$dir.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  trap 'exit 130' INT TERM  # so that the EXIT trap runs when interrupted
  start=$(date +%s)
  echo "helm: building helm $version from $module with $(go version | cut -d' ' -f3)"
  go_build "$module" "$tmp" "-s -w -X helm.sh/helm/v3/internal/version.version=$version" helm.sh/helm/v3/cmd/helm
  echo "$stamp" >"$tmp/.module"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT INT TERM
  echo "helm: built in $(( $(date +%s) - start ))s"
fi
echo "helm: $("$dir/helm" version --short)"
echo "$dir/helm"
