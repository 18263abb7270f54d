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
if ! tool_built "$dir" helm; then
  build_tool helm "helm $version" "$dir" "-s -w -X helm.sh/helm/v3/internal/version.version=$version" \
    helm.sh/helm/v3/cmd/helm
fi
echo "helm: $("$dir/helm" version --short)"
echo "$dir/helm"
