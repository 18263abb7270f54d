#!/usr/bin/env bash
# The project's checks: ruff, mypy, then the whole test suite. Extra arguments go to pytest.
#
#   bash scripts/test.sh            # everything (what CI runs)
#   bash scripts/test.sh --unit     # tests/unit alone: pure tests, no root, no build, under 20 seconds
#   bash scripts/test.sh tests/node -x   # some tests: everything is built first, then pytest runs with these
#
# The tiers are directories that say what their tests need: tests/unit (nothing), tests/node (root, real
# cgroups, the test NVML library), tests/cluster (a control plane, a kubelet on containerd, images, helm),
# tests/gpu (a real GPU with PyTorch; skipped elsewhere).
# The first full run on a machine also builds the Kubernetes control plane the cluster tests use, helm for the
# chart's checks, Prometheus and promtool for the alerts' and the dashboard's tests, and a Debian-made Python base
# for the agent's image (a few minutes each; cached under
# ~/.cache/vramguard and in buildah's storage, so later runs only rebuild the agent's image, about half a minute).
#
# Without arguments the older Kubernetes versions (all of hack/k8s/ but the newest) build in the background at the
# lowest CPU priority while the newest is built and every test but theirs runs: the tests mostly wait (on
# processes, timers, the API server), and the build takes the CPU they leave. Their cluster tests run last.
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

mapfile -t versions < <(printf '%s\n' hack/k8s/*/ | sed 's:^hack/k8s/::; s:/$::' | sort -V)
newest=${versions[-1]}
older=("${versions[@]:0:${#versions[@]}-1}")
if [ $# -gt 0 ] || [ ${#older[@]} -eq 0 ]; then
    bash scripts/controlplane.sh
    older=()
else
    bash scripts/controlplane.sh "$newest"
    log=$(mktemp -t vramguard-controlplane-older.XXXXXX)
    setsid nice -n 19 bash scripts/controlplane.sh "${older[@]}" >"$log" 2>&1 &
    background=$!
    trap 'kill -- "-$background" 2>/dev/null || true' EXIT  # its own process group: the go build too
    echo "test: building Kubernetes ${older[*]} in the background (nice 19), its output in $log"
fi
bash scripts/helm.sh
bash scripts/image.sh
bash scripts/node.sh
bash scripts/prometheus.sh
if [ ${#older[@]} -eq 0 ]; then
    exec .venv/bin/pytest "$@"
fi

# A test on an older version has the version's tag in its ID ("[v1.33.13]"): "v1.33." picks those out.
picks=""
for version in "${older[@]}"; do
    picks+="${picks:+ or }$version."
done
status=0
.venv/bin/pytest -k "not ($picks)" || status=$?
echo "test: waiting for the background build of Kubernetes ${older[*]}"
if ! wait "$background"; then
    tail -n 40 "$log" >&2
    echo "test: building Kubernetes ${older[*]} failed (the whole output: $log)" >&2
    exit 1
fi
trap - EXIT
cat "$log"
rm -f "$log"
.venv/bin/pytest tests/cluster -k "$picks" || status=$?
exit "$status"
