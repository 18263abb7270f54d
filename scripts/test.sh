#!/usr/bin/env bash
# The project's checks: ruff, mypy, then the whole test suite. Extra arguments go to pytest.
#
#   bash scripts/test.sh            # everything (what CI runs)
#   bash scripts/test.sh --unit     # tests/unit alone: pure tests, no root, no build, under 20 seconds
#   bash scripts/test.sh tests/node -x   # some tests: everything is built first, then pytest runs with these
#
# The tiers are directories that say what their tests need: tests/unit (nothing), tests/node (root, real
# cgroups, the test NVML library), tests/cluster (what the test command builds: the Kubernetes control plane, a
# kubelet on containerd, the images, helm, Prometheus), tests/gpu (a real GPU with PyTorch; skipped elsewhere).
#
# Without arguments the builds run beside the tests that need none of them. After the Debian packages (one apt-get
# run) and the Python environment, three builds start in the background, each in its own process group:
#   tools   the newest Kubernetes (hack/k8s/<newest>), then helm and Prometheus from the same module, which compile
#           only what is theirs (scripts/gobuild.sh), at nice 10;
#   images  the test node's images, then the agent's image, at nice 10;
#   older   the older Kubernetes versions (the rest of hack/k8s/), at nice 19: it takes the CPU the others leave.
# Meanwhile ruff and mypy run, then tests/unit, tests/node and tests/gpu (they mostly wait on processes and timers,
# and have the CPU first). Then tests/cluster on the newest version once tools and images are built, and on the
# older versions once they are, each as two pytest runs side by side (the real-node tests, and the rest). Everything built is cached (CONTRIBUTING.md names where), so a second run builds
# only the agent's image.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [[ "${1:-}" == "--unit" ]]; then
    shift
    exec .venv/bin/pytest tests/unit "$@"
fi
bash scripts/packages.sh
source scripts/gobuild.sh

mapfile -t versions < <(printf '%s\n' hack/k8s/*/ | sed 's:^hack/k8s/::; s:/$::' | sort -V)
newest=${versions[-1]}
older=("${versions[@]:0:${#versions[@]}-1}")

if [ $# -gt 0 ]; then
    .venv/bin/ruff check .
    .venv/bin/ruff format --check .
    .venv/bin/mypy
    bash scripts/controlplane.sh
    bash scripts/helm.sh
    bash scripts/prometheus.sh
    bash scripts/node.sh
    bash scripts/image.sh
    exec .venv/bin/pytest "$@"
fi

now() { date +%s; }
begun=$(now)
logs=$(mktemp -d -t vramguard-builds.XXXXXX)
declare -A build_pid=()
# background NAME NICENESS COMMAND...: runs COMMAND at NICENESS in a process group of its own (so that the go build
# under it stops too when this script does), its output in $logs/NAME.log.
background() {
    local name=$1 niceness=$2
    shift 2
    setsid nice -n "$niceness" bash -c "$*" >"$logs/$name.log" 2>&1 &
    build_pid[$name]=$!
    echo "test: building $name in the background (nice $niceness), its output in $logs/$name.log"
}
stop_builds() {
    local pid
    for pid in "${build_pid[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
}
trap stop_builds EXIT
# finish NAME: waits for the build NAME and shows its output; fails the run when the build failed.
finish() {
    local name=$1 status=0
    echo "test: waiting for the $name build ($(( $(now) - begun ))s in)"
    wait "${build_pid[$name]}" || status=$?
    unset "build_pid[$name]"
    cat "$logs/$name.log"
    if [ "$status" -ne 0 ]; then
        echo "test: the $name build failed (exit $status)" >&2
        exit 1
    fi
    echo "test: $name built ($(( $(now) - begun ))s in)"
}

background tools 10 "bash scripts/controlplane.sh $newest && bash scripts/helm.sh && bash scripts/prometheus.sh"
background images 10 "bash scripts/node.sh && bash scripts/image.sh"
if [ ${#older[@]} -gt 0 ]; then
    background older 19 "bash scripts/controlplane.sh ${older[*]}"
fi

status=0
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/pytest tests/unit tests/node tests/gpu || status=$?

finish tools
finish images
# tests/cluster as two pytest runs side by side: the tier mostly waits (on the API server, the kubelet, the agents'
# scans). The modules marked real_node take the host's real node, so they run one after the other in one run (its
# output shown when both are done); the rest in the other. K picks the Kubernetes versions' tests.
cluster() {
    local k=$1 out pid side=0
    out=$(mktemp "$logs/real-node.XXXXXX")
    setsid .venv/bin/pytest tests/cluster -m real_node -k "$k" >"$out" 2>&1 &
    pid=$!
    build_pid[real-node]=$pid  # stopped with the builds if this script is
    .venv/bin/pytest tests/cluster -m "not real_node" -k "$k" || status=$?
    wait "$pid" || side=$?
    unset "build_pid[real-node]"
    echo "test: the real-node tests ($k), run beside the others:"
    cat "$out"
    [ "$side" -eq 0 ] || status=$side
}
if [ ${#older[@]} -eq 0 ]; then
    cluster ""
    exit "$status"
fi
# A test on an older version has the version's tag in its ID ("[v1.33.13]"): "v1.33." picks those out.
picks=""
for version in "${older[@]}"; do
    picks+="${picks:+ or }$version."
done
cluster "not ($picks)"
finish older
cluster "$picks"
echo "test: done in $(( $(now) - begun ))s after the Python environment and the packages"
exit "$status"
