#!/usr/bin/env bash
# Creates .venv with vramguard, its dev tools and the test bench (testbed/, never in the agent's wheel).
# Idempotent: reinstalls only when a pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.vramguard-installed
want=$(cat pyproject.toml testbed/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]' -e ./testbed
  echo "$want" > "$stamp"
fi
# The test NVML library is compiled from C by the tests and the demo; say early if there is no compiler.
command -v "${CC:-cc}" >/dev/null || { echo "setup: a C compiler (cc) is needed for the test NVML library" >&2; exit 1; }
