#!/usr/bin/env bash
# Debian's Prometheus for the tests of the chart's alerting rules and the Grafana dashboard: `promtool` checks and
# unit-tests the rules (tests/node/test_alert_rules.py) and `prometheus` scrapes the real agents on the real node
# (tests/cluster/test_prometheus.py). Installed with apt-get when missing, without the recommended node exporter;
# no service of it is started or needed. Prints promtool's path as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt.sh
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  apt_install prometheus --no-install-recommends prometheus
fi
echo "prometheus: $(promtool --version 2>&1 | head -n1)"
command -v promtool
