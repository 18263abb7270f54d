"""structlog set-up: JSON lines in the cluster, readable colours on a terminal."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

import structlog
from structlog.typing import EventDict, WrappedLogger

from vramguard.core.text import MAX_TEXT_CHARS, cut, printable

# Log values come from tenants (annotations, pod names, messages built from them): each string is cut to the
# length an Event message may have, so a 10 MB annotation costs a line, not 10 MB per scan.
MAX_VALUE_CHARS = MAX_TEXT_CHARS


def cut_long_values(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """A structlog processor: every string value (and string in a list or tuple) cut to MAX_VALUE_CHARS."""
    for key, value in event_dict.items():
        if isinstance(value, str):
            event_dict[key] = cut(value)
        elif isinstance(value, (list, tuple)) and any(isinstance(v, str) and len(v) > MAX_VALUE_CHARS for v in value):
            event_dict[key] = [cut(v) if isinstance(v, str) else v for v in value]
    return event_dict


# Values that are many lines by nature: each line escaped on its own, so a traceback still reads as one, and
# indented, so a newline in an exception's message cannot start a line that passes for a log line.
_TRACEBACK_KEYS = frozenset({"exception", "stack"})


@dataclass(frozen=True, slots=True)
class _Shown:
    """A value the console shows through repr(): its repr, escaped (a type's own __repr__ may quote text raw)."""

    text: str

    def __repr__(self) -> str:
        return self.text


def escape_for_terminal(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """A structlog processor for console output: every key and value shown through `text.printable`, so a tenant's
    pod name cannot put escape sequences or bidi overrides on a terminal. JSON output needs none: the encoder
    escapes controls and the text stays exact.

    An exception is rendered here as a plain traceback, each of its lines escaped and indented: the console
    renderer's own formatters would print its message raw."""
    event_dict = structlog.processors.format_exc_info(logger, method_name, event_dict)
    escaped: EventDict = {}
    for key, value in event_dict.items():
        if isinstance(value, str) and key in _TRACEBACK_KEYS:
            value = "\n".join(f"  {printable(line)}" for line in value.split("\n"))
        elif isinstance(value, str):
            value = printable(value)
        else:
            value = _Shown(printable(repr(value)))
        escaped[printable(key) if isinstance(key, str) else key] = value
    return escaped


def configure_logging(log_format: str = "auto", level: str = "info") -> None:
    """`log_format` is json, console, or auto (console on a terminal, JSON otherwise)."""
    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    console = log_format != "json"
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            cut_long_values,
            *([escape_for_terminal] if console else []),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # Resolve sys.stderr when a logger is made, not now: whoever replaces it later (a test runner, a
        # daemoniser) must not leave the agent writing to a closed stream.
        logger_factory=lambda *args: structlog.PrintLogger(sys.stderr),
        cache_logger_on_first_use=False,
    )


class FailureRun:
    """Log once per run of failures: the first failure of a run, and again only when the error changes; a success
    ends the run. A retry loop that fails every second logs one line, not one a second.

    >>> run = FailureRun()
    >>> [run.failed("timeout"), run.failed("timeout"), run.failed("refused"), run.ok(), run.ok()]
    [True, False, True, True, False]
    """

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: str | None = None  # the error of the run going on, None between runs

    def failed(self, error: str) -> bool:
        """Record a failure; True when it should be logged (a run starts, or its error changed)."""
        new = error != self.error
        self.error = error
        return new

    def ok(self) -> bool:
        """Record a success; True when it ended a run of failures (worth a "recovered" line)."""
        ended = self.error is not None
        self.error = None
        return ended

    @property
    def failing(self) -> bool:
        return self.error is not None
