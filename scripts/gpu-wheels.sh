#!/usr/bin/env bash
# Wheels for scripts/gpu-device.sh: what vramguard, tests/gpu and bench/gpu.py import at run time that the lent
# GPU machine's image lacks. That machine has no network: the wheels travel with the working tree (carry them).
#
#   bash scripts/gpu-wheels.sh                                      # -> .gpu-wheels/ (CPython 3.12, x86_64)
#   PYTHON_VERSION=3.11 WHEELS=/tmp/w311 bash scripts/gpu-wheels.sh  # the same set for a dry run on this machine
#
# Each package at the version .venv holds, so the device runs what was tested here. vramguard and the test bench
# are not among them: gpu-device.sh runs them from the tree's src/ and testbed/src/ (a wheel built earlier could
# be older than the tree that travels). The test NVML library is not wanted there either: the GPU's NVML is real.
# The last step checks the closure: every requirement of a carried wheel is carried or in the device's image.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
WHEELS=${WHEELS:-.gpu-wheels}
LIMIT_MIB=60

# Missing from the device image (its package list: /work/.library/device/KINDS.md, "Python packages already
# there"); typing-extensions is there, but pydantic-core may need a newer one than the image's. nvidia-ml-py is
# there too, at a version of the image's choosing: the agent needs 13.615.71 or later (the driver-limit bindings),
# so the one .venv holds travels and comes first on the path.
PACKAGES=(
    structlog kubernetes pydantic pydantic-core annotated-types typing-inspection typing-extensions
    aiohttp-retry durationpy oauthlib requests-oauthlib websocket-client nvidia-ml-py
)
# In the device image (the part of its list that carried wheels may require).
DEVICE_HAS=(
    aiohttp aiosignal attrs certifi charset-normalizer click idna multidict prometheus-client
    pytest python-dateutil pyyaml requests rich shellingham six typer urllib3 yarl annotated-doc
)

[ -x .venv/bin/python ] || bash scripts/setup.sh
rm -rf "$WHEELS"
mkdir -p "$WHEELS"
pins=()
for name in "${PACKAGES[@]}"; do
    pins+=("$name==$(.venv/bin/python -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name")")
done
echo "gpu-wheels: ${pins[*]} for CPython $PYTHON_VERSION"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --implementation cp "${platforms[@]}" -d "$WHEELS" "${pins[@]}"

.venv/bin/python - "$WHEELS" "$PYTHON_VERSION" "$LIMIT_MIB" "${DEVICE_HAS[@]}" <<'EOF'
import sys, zipfile
from email.parser import Parser
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

wheels, python, limit_mib = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
device = {canonicalize_name(n) for n in sys.argv[4:]}
environment = {"python_version": python, "python_full_version": f"{python}.0", "extra": ""}
carried, missing = {}, []
for wheel in sorted(wheels.glob("*.whl")):
    name = parse_wheel_filename(wheel.name)[0]
    if name in carried:
        sys.exit(f"gpu-wheels: two versions of {name}: one stops the whole install")
    carried[name] = wheel
for name, wheel in carried.items():
    with zipfile.ZipFile(wheel) as z:
        meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(environment):
            continue
        dep = canonicalize_name(req.name)
        if dep not in carried and dep not in device:
            missing.append(f"{name} needs {req}")
size = sum(w.stat().st_size for w in carried.values())
print(f"gpu-wheels: {len(carried)} wheels, {size / 2**20:.1f} MiB in {wheels}")
if missing:
    sys.exit("gpu-wheels: neither carried nor on the device:\n  " + "\n  ".join(missing))
if size > limit_mib * 2**20:
    sys.exit(f"gpu-wheels: {size / 2**20:.1f} MiB is over the {limit_mib} MiB the working tree can spare")
EOF
