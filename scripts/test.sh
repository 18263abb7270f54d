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
# Without arguments the builds run beside the tests that need none of them, each in the background in a session of
# its own, whose scheduling group gets the CPU the foreground leaves (the kernel shares the CPU between sessions
# first, so a plain `nice` would not do):
#   tools   the newest Kubernetes (hack/k8s/<newest>), then helm and Prometheus from the same module, which compile
#           only what is theirs (scripts/gobuild.sh); at nice 10, started first: it needs only Go;
#   older   the older Kubernetes versions (the rest of hack/k8s/), at nice 19: what the others leave;
#   images  the test node's images, then the agent's image, at nice 10, once the Debian packages are in (one apt-get
#           run, scripts/packages.sh) beside the Python environment.
# Meanwhile ruff and mypy run, then tests/unit, tests/node and tests/gpu. Then tests/cluster, as two pytest runs
# side by side: the modules marked real_node (one real node per host, so one after the other) on the newest
# version, and beside them the other tests of the newest version, then, once built, those of the older ones; last
# the older versions' real-node tests.
# Everything built is cached (CONTRIBUTING.md names where), so a second run builds only the agent's image.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--unit" ]]; then
    shift
    bash scripts/setup.sh
    exec .venv/bin/pytest tests/unit "$@"
fi

mapfile -t versions < <(printf '%s\n' hack/k8s/*/ | sed 's:^hack/k8s/::; s:/$::' | sort -V)
newest=${versions[-1]}
older=("${versions[@]:0:${#versions[@]}-1}")

if [ $# -gt 0 ]; then
    bash scripts/setup.sh
    bash scripts/packages.sh
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
# background NAME NICENESS COMMAND: runs COMMAND in a session of its own (so that it and the go build under it can
# be stopped as one process group) at NICENESS, its scheduling group's too, its output in $logs/NAME.log.
background() {
    local name=$1 niceness=$2 command=$3
    # shellcheck disable=SC2016  # expanded by the inner shell
    setsid bash -c 'echo "$1" >/proc/self/autogroup 2>/dev/null || true; exec nice -n "$1" bash -c "$2"' \
        _ "$niceness" "$command" >"$logs/$name.log" 2>&1 &
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
if [ ${#older[@]} -gt 0 ]; then
    background older 19 "bash scripts/controlplane.sh ${older[*]}"
fi
bash scripts/setup.sh
bash scripts/packages.sh
background images 10 "bash scripts/node.sh && bash scripts/image.sh"

status=0
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/pytest tests/unit tests/node tests/gpu || status=$?
echo "test: unit, node and GPU tiers done ($(( $(now) - begun ))s in)"

finish tools
finish images
# The cluster tier mostly waits (on the API server, the kubelet, the agents' scans): the real-node tests of the
# newest version run in the background (their output shown when they are done), the others in the foreground.
# A test on an older version has the version's tag in its ID ("[v1.33.13]"): "v1.33." picks those out.
picks=""
for version in "${older[@]}"; do
    picks+="${picks:+ or }$version."
done
newest_only=${picks:+not ($picks)}
out=$logs/real-node.log
setsid .venv/bin/pytest tests/cluster -m real_node -k "$newest_only" >"$out" 2>&1 &
build_pid[real-node]=$!  # stopped with the builds if this script is
.venv/bin/pytest tests/cluster -m "not real_node" -k "$newest_only" || status=$?
if [ ${#older[@]} -gt 0 ]; then
    finish older
    .venv/bin/pytest tests/cluster -m "not real_node" -k "$picks" || status=$?
fi
side=0
wait "${build_pid[real-node]}" || side=$?
unset "build_pid[real-node]"
echo "test: the real-node tests on $newest, run beside the others:"
cat "$out"
[ "$side" -eq 0 ] || status=$side
if [ ${#older[@]} -gt 0 ]; then
    # Exit status 5: no test is both (none of the real-node modules runs on the older versions today).
    .venv/bin/pytest tests/cluster -m real_node -k "$picks" || { side=$?; [ "$side" -eq 5 ] || status=$side; }
fi
echo "test: done in $(( $(now) - begun ))s"
exit "$status"
