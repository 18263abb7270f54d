#!/usr/bin/env bash
# Renders the plain manifest deploy/daemonset.yaml from the Helm chart (release "vramguard" in namespace
# "vramguard", default values, no Helm labels), so the two never drift; tests/cluster/test_helm.py checks it is current.
# Usage: bash scripts/render-manifest.sh [OUTPUT]   (default: deploy/daemonset.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
helm=$(bash scripts/helm.sh | tail -n1)
out=${1:-deploy/daemonset.yaml}
{
  echo "# vramguard: one agent per GPU node. Apply with \`kubectl apply -f deploy/daemonset.yaml\`."
  echo "# Generated from the Helm chart deploy/helm/vramguard by scripts/render-manifest.sh: edit the chart, not this"
  echo "# file. The integration tests apply this very file to a real API server."
  echo "apiVersion: v1"
  echo "kind: Namespace"
  echo "metadata:"
  echo "  name: vramguard"
  echo "  labels:"
  echo "    app.kubernetes.io/name: vramguard"
  "$helm" template vramguard deploy/helm/vramguard --namespace vramguard --kube-version v1.33.0 --set helmLabels=false
} > "$out.tmp"
mv "$out.tmp" "$out"
