"""The `vramguard` command line: policy check, version, and bad input that is refused clearly."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vramguard import __version__
from vramguard.cli.main import app, version_dict, version_lines
from vramguard.http.status import DriverFacts

runner = CliRunner()
EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml"
# A file name as anyone with a directory may write it: a clear-screen sequence, a bell, bidi marks, a tab.
HOSTILE_NAME = "\x1b[2J\x07\u202e\u200f\t"
HOSTILE_NAME_SHOWN = "\\x1b[2J\\x07\\u202e\\u200f\\x09"


def raw_controls(text: str) -> set[str]:
    """The characters a terminal would interpret (controls, bidi and other format characters), newlines aside."""
    return {c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")}


def test_policy_check_accepts_the_example() -> None:
    """The shipped example policy is valid."""
    result = runner.invoke(app, ["policy", "check", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output


@pytest.mark.parametrize("command", [["policy", "check"], ["run", "--watch-interval", "soon", "--policy"]])
def test_a_policy_config_maps_directory_is_taken_where_a_policy_file_is(tmp_path: Path, command: list[str]) -> None:
    """The chart mounts the policy ConfigMap and runs `--policy=/etc/vramguard`: the directory passes the option's
    own checks (a `--policy` that took files only would stop every agent at start) and is read whole."""
    version = tmp_path / "..2026_12_02"
    version.mkdir()
    (version / "policy.yaml").write_text("mode: kill\n")
    (version / "exempt_namespaces").write_text("kube-system ml-infra")
    (tmp_path / "..data").symlink_to(version.name)
    for key in ("policy.yaml", "exempt_namespaces"):
        (tmp_path / key).symlink_to(f"..data/{key}")
    result = runner.invoke(app, [*command, str(tmp_path)])
    assert "is a directory" not in result.output, result.output
    if command[0] == "policy":
        assert result.exit_code == 0 and "ok" in result.output, result.output
    else:  # past the options: the run stops at the interval it was given, checked before anything starts
        assert result.exit_code == 2 and "--watch-interval" in result.output, result.output


def test_policy_check_names_every_bad_field(tmp_path: Path) -> None:
    """Each error names the field path and the value; all errors are reported, and the exit code is 1."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: destroy\ncooldown: soon\nnamespaces:\n  team-a: {max_quota: 16GB}\n")
    result = runner.invoke(app, ["policy", "check", str(bad)])
    assert result.exit_code == 1
    out = result.output
    assert "mode" in out and "destroy" in out
    assert "cooldown" in out and "soon" in out
    assert "namespaces.team-a.max_quota" in out and "16GB" in out


def test_run_refuses_an_invalid_policy(tmp_path: Path) -> None:
    """`run` with an invalid policy exits 2 with the field named, before touching anything."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_actions_per_scan: 0\n")
    result = runner.invoke(app, ["run", "--policy", str(bad), "--pods-file", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2
    assert "max_actions_per_scan" in result.output


@pytest.mark.parametrize("command", ["run", "top"])
def test_a_kubelet_cgroup_root_that_cannot_be_one_is_refused(tmp_path: Path, command: str) -> None:
    """`--kubelet-cgroup-root` naming the kubelet's pods directory instead of its root exits 2, naming the flag, the
    value and what to give instead, before touching anything."""
    argv = [command, "--kubelet-cgroup-root", "/kubepods.slice", "--pods-file", str(tmp_path / "p.yaml")]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert '--kubelet-cgroup-root: "/kubepods.slice" names the kubelet\'s pods directory' in result.output
    assert "the root is /" in result.output


def test_version_exits_0_whatever_nvml_says() -> None:
    """`version` prints four lines, the package's version first, and exits 0 with or without NVML on this machine;
    `--json` is one object with the NVIDIA side's keys, null or not."""
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 4 and lines[0] == f"vramguard {__version__}", lines
    assert lines[1].startswith("nvidia-ml-py ") and lines[2].startswith("NVIDIA driver")
    assert lines[3].startswith("driver limits: ")

    answer = runner.invoke(app, ["version", "--json"])
    assert answer.exit_code == 0, answer.output
    doc = json.loads(answer.stdout)
    assert doc["vramguard"] == __version__ and doc["binds_limits"] is True, "the package requires the bindings"
    assert {"driver_version", "nvml_version", "driver_limits_possible", "driver_limits_reason", "nvml_problem"} <= set(
        doc
    )


NO_NVML = "NVML is not available: libnvidia-ml.so.1 was not found. Install the NVIDIA driver on the node"


@pytest.mark.parametrize(
    ("driver", "expected"),
    [
        pytest.param(
            DriverFacts("13.615.71", True, "615.40.02", "13.615.40.02", True, ""),
            ["nvidia-ml-py 13.615.71 (binds the driver's per-cgroup memory limits)",
             "NVIDIA driver 615.40.02, NVML 13.615.40.02", "driver limits: possible"],
            id="r615-driver-limits-possible",
        ),
        pytest.param(
            DriverFacts("13.615.71", True, "615.40.02", "13.615.40.02", True, "GPU 1 does not support memory limits"),
            ["nvidia-ml-py 13.615.71 (binds the driver's per-cgroup memory limits)",
             "NVIDIA driver 615.40.02, NVML 13.615.40.02",
             "driver limits: possible (not everywhere: GPU 1 does not support memory limits)"],
            id="one-gpu-without-support-says-which",
        ),
        pytest.param(
            DriverFacts("13.615.71", True, "550.54.15", "12.550.54.15", False,
                        "the driver has no nvmlDeviceGetMemoryLimits_v1 (it needs R615 or later)"),
            ["nvidia-ml-py 13.615.71 (binds the driver's per-cgroup memory limits)",
             "NVIDIA driver 550.54.15, NVML 12.550.54.15",
             "driver limits: not possible: the driver has no nvmlDeviceGetMemoryLimits_v1 (it needs R615 or later)"],
            id="driver-before-r615-not-possible-and-why",
        ),
        pytest.param(
            DriverFacts("12.535.161", False, "615.40.02", "13.615.40.02", False,
                        "nvidia-ml-py 12.535.161 has no memory-limit bindings (13.615.71 or later has)"),
            ["nvidia-ml-py 12.535.161 (no bindings for the driver's per-cgroup memory limits: 13.615.71 or later "
             "has them)",
             "NVIDIA driver 615.40.02, NVML 13.615.40.02",
             "driver limits: not possible: nvidia-ml-py 12.535.161 has no memory-limit bindings (13.615.71 or later "
             "has)"],
            id="old-bindings-on-an-r615-driver-say-so",
        ),
        pytest.param(
            DriverFacts("13.615.71", True, limits_possible=False, limits_reason="NVML is not available",
                        problem=NO_NVML),
            ["nvidia-ml-py 13.615.71 (binds the driver's per-cgroup memory limits)",
             f"NVIDIA driver: unknown ({NO_NVML})", "driver limits: not possible: NVML is not available"],
            id="no-nvml-says-why-on-one-line",
        ),
        pytest.param(
            DriverFacts("13.615.71", True, "615.40.02", "13.615.40.02", None,
                        "nvmlDeviceGetMemoryLimits_v1 on GPU 0: Insufficient Permissions"),
            ["nvidia-ml-py 13.615.71 (binds the driver's per-cgroup memory limits)",
             "NVIDIA driver 615.40.02, NVML 13.615.40.02",
             "driver limits: unknown: nvmlDeviceGetMemoryLimits_v1 on GPU 0: Insufficient Permissions"],
            id="a-driver-that-cannot-answer-is-unknown",
        ),
        pytest.param(
            DriverFacts("13.615.71", True, "580.95.05", "13.580.95.05", False, "needs R615",
                        nvml_library="/host/driver/usr/lib64/libnvidia-ml.so.1"),
            ["nvidia-ml-py 13.615.71 (binds the driver's per-cgroup memory limits)",
             "NVIDIA driver 580.95.05, NVML 13.580.95.05 (loaded from /host/driver/usr/lib64/libnvidia-ml.so.1)",
             "driver limits: not possible: needs R615"],
            id="the-library-loaded-is-named",
        ),
    ],
)  # fmt: skip
def test_version_lines_say_the_bindings_the_driver_and_the_limits(driver: DriverFacts, expected: list[str]) -> None:
    """Each line says one thing: the agent, nvidia-ml-py and whether it binds the limits, the driver and NVML (or
    why NVML is not up), and whether the driver can hold limits here, and why not."""
    assert version_lines(driver) == [f"vramguard {__version__}", *expected]


def test_version_json_carries_the_nvidia_side_as_status_does() -> None:
    """`--json` has the fields of /status's agent part, whether the bindings are there, and why NVML is not up."""
    doc = version_dict(DriverFacts("13.615.71", True, limits_possible=False, limits_reason="NVML is not available",
                                   problem=NO_NVML))  # fmt: skip
    assert json.loads(json.dumps(doc)) == doc
    assert {k: v for k, v in doc.items() if k not in ("python", "pid")} == {
        "vramguard": __version__, "nvidia_ml_py": "13.615.71", "driver_version": None, "nvml_version": None,
        "driver_limits_possible": False, "driver_limits_reason": "NVML is not available", "binds_limits": True,
        "nvml_problem": NO_NVML, "nvml_library": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("content", "code"),
    [
        pytest.param("mode: warn\n", 0, id="valid-file-ok-line"),
        pytest.param("mode: destroy\n", 1, id="invalid-file-error-line"),
    ],
)
def test_policy_check_shows_a_hostile_file_name_escaped(tmp_path: Path, content: str, code: int) -> None:
    """A file name's control, bidi and newline characters are shown escaped: one line, nothing raw."""
    path = tmp_path / f"policy{HOSTILE_NAME}\n.yaml"
    path.write_text(content)
    result = runner.invoke(app, ["policy", "check", str(path)])
    assert result.exit_code == code
    assert raw_controls(result.output) == set() and result.output.count("\n") == 1, repr(result.output)
    assert f"policy{HOSTILE_NAME_SHOWN}\\x0a.yaml: " in result.output


def test_an_error_of_many_lines_keeps_them_and_indents_every_further_line(tmp_path: Path) -> None:
    """`run` with a bad policy: its problems on lines of their own under the first, each indented, so a newline in a
    file name cannot start a line that reads as a message of its own; nothing raw."""
    bad = tmp_path / f"bad{HOSTILE_NAME}\nvramguard: ok.yaml"
    bad.write_text("mode: destroy\ncooldown: soon\n")
    result = runner.invoke(app, ["run", "--policy", str(bad), "--pods-file", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2
    first, *rest = result.output.removesuffix("\n").split("\n")
    assert first.startswith("vramguard: invalid policy in ") and first.endswith(f"bad{HOSTILE_NAME_SHOWN}")
    assert rest[0] == "  vramguard: ok.yaml (2 errors):" and len(rest) == 3
    assert all(line.startswith("  ") for line in rest) and raw_controls(result.output) == set(), result.output
