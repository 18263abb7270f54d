#!/usr/bin/env bash
# Builds Prometheus and promtool for the tests of the chart's alerting rules and the Grafana dashboard: `promtool`
# checks and unit-tests the rules (tests/cluster/test_alert_rules.py) and `prometheus` discovers the real agents
# through the API server and scrapes them (tests/cluster/test_prometheus.py). Built from the newest Kubernetes'
# module (hack/k8s/<newest>/go.mod pins it beside Kubernetes: scripts/gobuild.sh says why), with Kubernetes service
# discovery (Debian's package has none), into ${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/prometheus/<version>/
# (tests/monitoring_fixtures.py reads the same path); a second run only checks that both binaries are there. The
# build goes to a temporary directory renamed into place, so an interrupted one leaves nothing that looks finished.
# Prints promtool's path as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gobuild.sh
module_dir=$(newest_module)
# github.com/prometheus/prometheus tags Prometheus 3.x as Go module versions v0.3xx.y: v0.316.0 is 3.16.0.
module=$(awk '$1 == "github.com/prometheus/prometheus" { print $2 }' "$module_dir/go.mod")
version=$(echo "$module" | sed -E 's/^v0\.3([0-9]{2})\.([0-9]+)$/3.\1.\2/; s/^3\.0([0-9])/3.\1/')
[[ "$version" =~ ^3\.[0-9]+\.[0-9]+$ ]] || { echo "prometheus: cannot read a 3.x version from $module" >&2; exit 1; }
dir="${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/prometheus/$version"  # tests/monitoring_fixtures.py
if ! tool_built "$dir" prometheus promtool; then
  # Without these `--version` reports an empty version, as a build outside the project's Makefile does.
  ldflags="-s -w"
  for var in Version="$version" Revision="$module" Branch=module-proxy \
    BuildDate="$(module_time "$module_dir" github.com/prometheus/prometheus 20060102-15:04:05)"; do
    ldflags+=" -X github.com/prometheus/common/version.$var"
  done
  build_tool prometheus "Prometheus $version" "$dir" "$ldflags" \
    github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
fi
echo "prometheus: $("$dir/promtool" --version 2>&1 | head -n1)"
echo "$dir/promtool"
