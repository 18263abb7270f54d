#!/usr/bin/env bash
# The project's checks: ruff, mypy, then the whole test suite. Extra arguments go to pytest.
# The first run on a machine also builds the Kubernetes control plane the integration tests use and helm for the
# chart's checks (a few minutes; cached under ~/.cache/vramguard, so later runs start at once).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
bash scripts/controlplane.sh
bash scripts/helm.sh
.venv/bin/pytest "$@"
