"""helm for the tests: the binary scripts/helm.sh builds into the tool cache, and rendering the chart."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from real_parts import need

CHART = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "vramguard"
HELM_VERSION = "v3.22.0"  # as scripts/helm.sh builds it
CACHE = Path(os.environ.get("VRAMGUARD_CACHE", Path.home() / ".cache" / "vramguard"))
HELM = CACHE / "tools" / f"helm-{HELM_VERSION}" / "helm"
KUBE_VERSION = "v1.33.0"


def need_helm() -> Path:
    """The helm binary; skips when it is not built, or fails under CI (scripts/test.sh builds it first)."""
    reason = None if HELM.exists() else f"helm {HELM_VERSION} is not built at {HELM}"
    need(reason, skip="no helm (bash scripts/helm.sh builds it)", ci="build helm first")
    return HELM


def render(
    helm: Path,
    *sets: str,
    release: str = "vramguard",
    namespace: str = "vramguard",
    values: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """`helm template` of the chart with `--set` values, after `values` (a values file, for values `--set` would
    retype, such as a YAML number or "12e9"): the objects, in helm's install order."""
    args = [str(helm), "template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values_file:
        if values is not None:
            yaml.safe_dump(dict(values), values_file)
            values_file.flush()
            args += ["--values", values_file.name]
        for s in sets:
            args += ["--set", s]
        out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one(objects: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    """The one object of `kind` (whose name ends with `name_suffix`)."""
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    return found


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert isinstance(c, dict)
    return c
