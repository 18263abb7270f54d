#!/usr/bin/env bash
# The project's checks: ruff, mypy, then the whole test suite. Extra arguments go to pytest.
#
#   bash scripts/test.sh            # everything (what CI runs)
#   bash scripts/test.sh --unit     # tests/unit alone: pure tests, no root, no build, under 30 seconds
#
# The tiers are directories that say what their tests need: tests/unit (nothing), tests/node (root, real
# cgroups, the test NVML library), tests/cluster (a control plane, a kubelet on containerd, images, helm),
# tests/gpu (a real GPU with PyTorch; skipped elsewhere).
# The first full run on a machine also builds the Kubernetes control plane the cluster tests use, helm for the
# chart's checks, Prometheus and promtool for the alerts' and the dashboard's tests, and a Debian-made Python base
# for the agent's image (a few minutes each; cached under
# ~/.cache/vramguard and in buildah's storage, so later runs only rebuild the agent's image, about half a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [[ "${1:-}" == "--unit" ]]; then
    shift
    exec .venv/bin/pytest tests/unit "$@"
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
bash scripts/controlplane.sh
bash scripts/helm.sh
bash scripts/image.sh
bash scripts/node.sh
bash scripts/prometheus.sh
.venv/bin/pytest "$@"
