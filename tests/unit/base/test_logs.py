"""Logging set-up: JSON lines or console output, always on the current standard error."""

from __future__ import annotations

import io
import json
import re
import sys
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest
import structlog

from vramguard.base.logs import configure_logging


def test_json_lines_follow_stderr_even_after_it_was_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Configured while stderr was a stream that later closed, logging still works, on the current stderr."""
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("json")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    structlog.get_logger("t").warning("gpu_unhealthy", gpu="0")
    entry = json.loads(second.getvalue())
    assert (entry["event"], entry["gpu"], entry["level"]) == ("gpu_unhealthy", "0", "warning")


def test_long_values_are_cut_in_every_log_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 10 MB value (a tenant's annotation) is logged cut to 1024 characters, in a string or inside a list."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    configure_logging("json")
    huge = "9" * 10_000_000
    structlog.get_logger("t").warning("quota_invalid", value=huge, values=[huge, 7], short="12Gi")
    entry = json.loads(out.getvalue())
    assert len(entry["value"]) == 1024 and entry["value"].endswith("...[cut: 10000000 characters]")
    assert entry["values"] == [entry["value"], 7]
    assert entry["short"] == "12Gi"


# A pod name as a hostile tenant writes it: a clear-screen sequence, a bell, bidi overrides, a return, a tab and a
# newline that would forge a log line.
HOSTILE = "evil\x1b[2J\x1b[H\x07\u202eexe\u200f\r\t\nforged"

_OWN_COLOURS = re.compile(r"\x1b\[[0-9;]*m")  # the console renderer's colours (HOSTILE holds none)


class RawRepr:
    """An object whose own repr() quotes tenant text raw."""

    def __repr__(self) -> str:
        return HOSTILE


def log_exception(log: Any) -> None:
    try:
        raise ValueError(f"pod {HOSTILE} is gone")
    except ValueError:
        log.exception("scan_failed")


def logged(monkeypatch: pytest.MonkeyPatch, log_format: str, write: Callable[[Any], None]) -> str:
    """What `write(logger)` puts on standard error in `log_format`."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    configure_logging(log_format)
    write(structlog.get_logger("t"))
    return out.getvalue()


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda log: log.warning("quota_invalid", pod=HOSTILE), id="string-value"),
        pytest.param(lambda log: log.warning(HOSTILE), id="event"),
        pytest.param(lambda log: log.warning("quota_invalid", **{HOSTILE: 1}), id="key"),
        pytest.param(lambda log: log.warning("quota_invalid", pods=[HOSTILE, 7]), id="list-value"),
        pytest.param(lambda log: log.warning("quota_invalid", labels={"app": HOSTILE}), id="mapping-value"),
        pytest.param(lambda log: log.warning("quota_invalid", pod=RawRepr()), id="object-whose-repr-is-raw"),
        pytest.param(log_exception, id="exception-message-in-a-traceback"),
    ],
)
def test_console_shows_tenant_text_escaped(monkeypatch: pytest.MonkeyPatch, write: Callable[[Any], None]) -> None:
    """On a terminal no control or bidi character of a key, value or exception reaches the screen raw, and no line
    that the agent did not start begins at the left margin."""
    text = _OWN_COLOURS.sub("", logged(monkeypatch, "console", write))
    first, *rest = text.removesuffix("\n").split("\n")
    assert not [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")], repr(text)
    assert "evil\\x1b[2J\\x1b[H\\x07\\u202eexe\\u200f" in text
    assert " [" in first and all(line.startswith("  ") for line in rest), repr(text)


@pytest.mark.parametrize(
    ("fields", "key", "exact"),
    [
        pytest.param({"pod": HOSTILE}, "pod", HOSTILE, id="string-value"),
        pytest.param({HOSTILE: 1}, HOSTILE, 1, id="key"),
        pytest.param({"pods": [HOSTILE, 7]}, "pods", [HOSTILE, 7], id="list-value"),
        pytest.param({"labels": {"app": HOSTILE}}, "labels", {"app": HOSTILE}, id="mapping-value"),
        pytest.param({"pod": RawRepr()}, "pod", HOSTILE, id="object-as-its-repr"),
    ],
)
def test_json_lines_carry_tenant_text_exactly(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any], key: str, exact: object
) -> None:
    """A JSON line is one line whatever a value holds (the encoder escapes controls), and reads back exactly."""
    text = logged(monkeypatch, "json", lambda log: log.warning("quota_invalid", **fields))
    assert text.count("\n") == 1 and "\x1b" not in text and "\u202e" not in text
    assert json.loads(text)[key] == exact
