#!/usr/bin/env bash
# On a GPU machine without network access, from a copy of the repo's tree, as root: install the wheels that
# travelled with it, then run tests/gpu and bench/gpu.py, writing what they print under $OUT. Every step is printed with
# its command and exit status, and each runs whatever happened to the ones before it: failing GPU tests still
# leave the benchmark its turn. Exits 1 when any step failed.
#
#   bash scripts/gpu-wheels.sh                  # first, where pip works: the wheels, into .gpu-wheels/ (send it)
#   bash scripts/gpu-device.sh                  # on the GPU machine; arguments go to bench/gpu.py (e.g. --quick)
#   OUT=/tmp/out PYTHON=... WHEELS=... bash scripts/gpu-device.sh --fake-nvml --quick   # a dry run without a GPU
#
# Files in $OUT: env.txt (machine, GPU, Python packages), gpu-tests.log, gpu-test-report.json (tests/gpu's
# reaction time), gpu-bench.txt and gpu-bench.json (bench/gpu.py's figures), summary.txt (each step's status).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.gpu-out}
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.gpu-wheels}
SITE=${SITE:-/tmp/vramguard-site}
# Together under 10 minutes; tests that hang cannot take the benchmark's time.
TESTS_TIMEOUT_S=${TESTS_TIMEOUT_S:-180}
BENCH_TIMEOUT_S=${BENCH_TIMEOUT_S:-360}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
: >"$OUT/summary.txt"
failed=0

# step NAME LOG COMMAND...: runs COMMAND, its output to the terminal and appended to $OUT/LOG; records the status.
step() {
    local name=$1 log=$2 rc
    shift 2
    echo
    echo "=== $name ($(date -u +%H:%M:%S))"
    echo "+ $*"
    "$@" 2>&1 | tee -a "$OUT/$log"
    rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc"
    echo "$name: exit $rc" >>"$OUT/summary.txt"
    [ "$rc" -eq 0 ] || failed=1
    return 0
}

environment() {
    uname -a
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,mig.mode.current --format=csv || true
    "$PYTHON" --version
    "$PYTHON" -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-ml-py|psutil|typer|click|rich|prometheus|pyyaml|requests|urllib3|six|python-dateutil|typing.extensions|pytest|aiohttp) ' || true
    ls "$WHEELS"
}

install() {
    rm -rf "$SITE"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl
}

imports() {
    "$PYTHON" - <<'EOF'
import sys
import pynvml, structlog, kubernetes, vramguard, vramguard.cli.main, vramguard.cli.wiring, vramguard_testbed.simnode
from vramguard.nvml import BINDINGS_SINCE, binding_version, binds_limits
print("vramguard from", vramguard.__file__, "| kubernetes", kubernetes.__version__, "| structlog", structlog.__version__)
print("nvidia-ml-py", binding_version(), "pynvml from", pynvml.__file__)
if not binds_limits():  # the image's own, older one came first: the carried wheel did not
    sys.exit(f"nvidia-ml-py {binding_version()} has no driver-limit bindings: carry {BINDINGS_SINCE} or later")
EOF
    "$PYTHON" -m vramguard version
}

step environment env.txt environment
step install env.txt install
# The tree's own code first (what travelled is what runs), then the carried wheels, then the image's packages.
export PYTHONPATH="$PWD/src:$PWD/testbed/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
echo "PYTHONPATH=$PYTHONPATH"
step imports env.txt imports
export VRAMGUARD_GPU_REPORT="$OUT/gpu-test-report.json"
step "tests/gpu" gpu-tests.log \
    timeout -k 10 "$TESTS_TIMEOUT_S" "$PYTHON" -m pytest tests/gpu -v -rA -p no:cacheprovider
step "bench/gpu.py" gpu-bench.txt \
    timeout -k 10 "$BENCH_TIMEOUT_S" "$PYTHON" bench/gpu.py --json "$OUT/gpu-bench.json" "$@"
echo
echo "=== summary"
cat "$OUT/summary.txt"
exit "$failed"
