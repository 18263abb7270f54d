#!/usr/bin/env bash
# Sets up .venv, then shows the agent enforcing quotas on a simulated GPU node (run as root: real cgroups).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/vramguard-demo "$@"
