#!/usr/bin/env bash
# Builds Prometheus and promtool from the Go module proxy for the tests of the chart's alerting rules and the
# Grafana dashboard: `promtool` checks and unit-tests the rules (tests/node/test_alert_rules.py) and `prometheus`
# discovers the real agents through the API server and scrapes them (tests/cluster/test_prometheus.py).
# Built with Kubernetes service discovery (Debian's package has none): the build tags drop every other discovery
# but file and http. About 3.5 minutes cold on 2 cores, into
# ${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/prometheus/<version>/ (tests/monitoring_fixtures.py reads the same
# path); a second run only checks that both binaries are there. The build goes to a temporary directory renamed
# into place, so an interrupted one leaves nothing that looks finished. Prints promtool's path as its last line.
set -euo pipefail
version=3.16.0   # tests/monitoring_fixtures.py PROMETHEUS_VERSION
module=v0.316.0  # github.com/prometheus/prometheus tags Prometheus 3.x as Go module versions v0.3xx
dir="${VRAMGUARD_CACHE:-$HOME/.cache/vramguard}/prometheus/$version"
if [ ! -x "$dir/prometheus" ] || [ ! -x "$dir/promtool" ]; then
  command -v go >/dev/null || { echo "prometheus: Go is needed to build Prometheus $version" >&2; exit 1; }
  mkdir -p "$(dirname "$dir")"
  tmp=$(mktemp -d "$dir.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  trap 'exit 130' INT TERM  # so that the EXIT trap runs when interrupted
  start=$(date +%s)
  echo "prometheus: building Prometheus $version with $(go version | cut -d' ' -f3)"
  # Without these `--version` reports an empty version, as a build outside the project's Makefile does. The build
  # date is the tag's publication time, so two builds of one version are identical.
  build_date=$(go list -m -f '{{.Time.UTC.Format "20060102-15:04:05"}}' "github.com/prometheus/prometheus@$module")
  ldflags="-s -w"
  for var in Version="$version" Revision="$module" Branch=module-proxy BuildDate="$build_date"; do
    ldflags+=" -X github.com/prometheus/common/version.$var"
  done
  GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-mod=mod go install -trimpath -gcflags=all=-dwarf=false -ldflags "$ldflags" \
    -tags remove_all_sd,enable_kubernetes_sd \
    "github.com/prometheus/prometheus/cmd/prometheus@$module" "github.com/prometheus/prometheus/cmd/promtool@$module"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT INT TERM
  echo "prometheus: built in $(( $(date +%s) - start ))s"
fi
echo "prometheus: $("$dir/promtool" --version 2>&1 | head -n1)"
echo "$dir/promtool"
