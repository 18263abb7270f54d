"""structlog set-up: JSON lines in the cluster, readable colours on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(log_format: str = "auto", level: str = "info") -> None:
    """`log_format` is json, console, or auto (console on a terminal, JSON otherwise)."""
    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if log_format == "json" else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # Resolve sys.stderr when a logger is made, not now: whoever replaces it later (a test runner, a
        # daemoniser) must not leave the agent writing to a closed stream.
        logger_factory=lambda *args: structlog.PrintLogger(sys.stderr),
        cache_logger_on_first_use=False,
    )
