"""The versions the tests look for are the versions the build scripts build: each tool's cache path is keyed by a
version, and the scripts read it from the newest Kubernetes' go.mod (scripts/gobuild.sh), so a bump there that a
fixture did not follow would leave the tests looking for a binary that is never built."""

from __future__ import annotations

import re
from pathlib import Path

from cluster.controlplane import KUBERNETES_VERSIONS, NEWEST
from helm_fixtures import HELM_VERSION
from monitoring_fixtures import PROMETHEUS_VERSION

ROOT = Path(__file__).resolve().parents[2]
MODULES = ROOT / "hack" / "k8s"


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.lstrip("v").split(".")[:2]
    return int(major), int(minor)


def _newest_module() -> Path:
    return max(MODULES.iterdir(), key=lambda d: _minor(d.name))


def _required(go_mod: Path, module: str) -> str:
    found = re.findall(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", go_mod.read_text(), re.MULTILINE)
    assert len(found) == 1, f"{go_mod} requires {module} {len(found)} times"
    return str(found[0])


def test_each_kubernetes_version_the_tests_run_is_a_module_the_script_builds() -> None:
    pinned = {_required(d / "go.mod", "k8s.io/kubernetes") for d in MODULES.iterdir()}
    assert pinned == set(KUBERNETES_VERSIONS)
    assert _required(_newest_module() / "go.mod", "k8s.io/kubernetes") == NEWEST


def test_helm_and_prometheus_are_pinned_beside_the_newest_kubernetes_at_the_fixtures_versions() -> None:
    go_mod = _newest_module() / "go.mod"
    assert _required(go_mod, "helm.sh/helm/v3") == HELM_VERSION
    # Prometheus 3.x is tagged as Go module v0.3xx.y (v0.316.0 is 3.16.0): scripts/prometheus.sh maps it the same way.
    major, minor, patch = PROMETHEUS_VERSION.split(".")
    assert _required(go_mod, "github.com/prometheus/prometheus") == f"v0.{major}{int(minor):02d}.{patch}"


def test_the_tools_are_built_beside_the_newest_kubernetes_only() -> None:
    for module in MODULES.iterdir():
        text = (module / "go.mod").read_text()
        newest = module == _newest_module()
        assert ("helm.sh/helm/v3/cmd/helm" in text) is newest, module
        assert ("github.com/prometheus/prometheus/cmd/promtool" in text) is newest, module
