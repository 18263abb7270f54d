#!/usr/bin/env bash
# The project's checks: ruff, mypy, then the whole test suite. Extra arguments go to pytest.
# The first run on a machine also builds the Kubernetes control plane the integration tests use, helm for the
# chart's checks and a Debian-made Python base for the agent's image (a few minutes; cached under
# ~/.cache/vramguard and in buildah's storage, so later runs only rebuild the agent's image, about half a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
bash scripts/controlplane.sh
bash scripts/helm.sh
bash scripts/image.sh
bash scripts/node.sh
.venv/bin/pytest "$@"
