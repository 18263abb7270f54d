"""Logging set-up: JSON lines or console output, always on the current standard error."""

from __future__ import annotations

import io
import json
import sys

import pytest
import structlog

from vramguard.logs import configure_logging


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


def test_console_output_escapes_tenant_text_and_json_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal a pod name's escape sequence and bidi override are shown escaped; JSON lines carry them
    exactly (the encoder escapes controls itself)."""
    hostile = "evil\x1b[2J\x07\u202eexe"
    for log_format in ("console", "json"):
        out = io.StringIO()
        monkeypatch.setattr(sys, "stderr", out)
        configure_logging(log_format)
        structlog.get_logger("t").warning("action", pod=hostile, pids=[hostile], **{"key\u202e": "v"})
        text = out.getvalue()
        assert "\x1b[2J" not in text and "\x07" not in text
        if log_format == "console":
            assert "\u202e" not in text and "evil\\x1b[2J\\x07\\u202eexe" in text and "key\\u202e" in text
        else:
            entry = json.loads(text)
            assert entry["pod"] == hostile and entry["pids"] == [hostile] and entry["key\u202e"] == "v"
