#!/usr/bin/env bash
# Writes the generated references under docs/reference/ (metrics, policy keys, commands and flags, chart values)
# from the code and files that define them; tests/unit/test_docs_reference.py fails when one is stale.
# Usage: bash scripts/docs.sh [--check]   (--check: write nothing, exit 1 naming each stale page)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m vramguard_testbed.reference "$@"
