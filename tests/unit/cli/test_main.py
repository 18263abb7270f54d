"""The `vramguard` command line: policy check, version, and bad input that is refused clearly."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vramguard import __version__
from vramguard.cli.main import app

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


def test_version() -> None:
    """`version` prints the package version."""
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0 and result.output.strip() == f"vramguard {__version__}"
    assert json.loads(runner.invoke(app, ["version", "--json"]).output)["vramguard"] == __version__


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
