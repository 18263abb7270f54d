"""Text shown to people: tenant strings bounded (`cut`) and escaped (`printable`), values quoted (`show_value`),
byte counts in binary units (`format_bytes`).

A tenant controls pod names, annotation values and command lines. Unbounded, one 10 MB annotation costs 10 MB per
log line; written raw, an ESC sequence can clear an operator's screen and a bidirectional override (U+202E) can
make `evil` read as `live`. Human-facing output (tables, console logs, Event messages, errors) shows such
characters as escapes, as kubectl does; machine-facing output (JSON) carries the exact text.
"""

from __future__ import annotations

import json
import unicodedata

# Far above any honest value the agent reads (quantities are at most 64 characters, names 253), far below what a
# tenant can write (an annotation may be 256 KiB on the API server, anything in a pods file). Log values, Event
# messages, quota errors and pod fields are all held to it.
MAX_TEXT_CHARS = 1024


def cut(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """`text`, or its head and a marker saying how long it was, in at most `limit` characters.

    >>> cut("x" * 40, 30)
    'xxxxxxx...[cut: 40 characters]'

    A cut quantity is far over the 64-character bound of `vramguard.core.quantity`, so it is still reported invalid."""
    if len(text) <= limit:
        return text
    marker = f"...[cut: {len(text)} characters]"
    return text[: limit - len(marker)] + marker


def cut_head(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """`cut` for the head of a text that was read only in part (its whole length unknown): at most `limit`
    characters, with a marker saying it goes on."""
    marker = "...[cut: read in part]"
    return text[: limit - len(marker)] + marker


def show_value(value: object, limit: int = 80) -> str:
    """A value as a reader sees it in YAML or JSON, in at most `limit` characters: strings in double quotes, so
    `""` and `" 1Gi"` stay visible. A string too long is cut inside its quotes; one whose escapes make the quoted
    form too long is cut again, and that marker counts the quoted form."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, (int, float)):
        text = repr(value)
    elif isinstance(value, str):
        # Cut before encoding: a tenant's annotation may be megabytes long.
        text = json.dumps(cut(value, limit - 2), ensure_ascii=False)
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except ValueError:  # a circular structure; only reachable from code, never from YAML
            text = repr(value)
    return cut(text, limit)


def format_bytes(n: int | float) -> str:
    """1.5 GiB → "1.5GiB": binary units, one decimal, as people read Kubernetes quantities.

    >>> format_bytes(512), format_bytes(1536 * 1024**2)
    ('512B', '1.5GiB')
    """
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}TiB"


# Unicode categories shown escaped: controls (C0, DEL, C1), format characters (bidi embeddings, overrides and
# isolates, zero-width joiners, the soft hyphen, tags), line and paragraph separators, surrogates, private use
# and unassigned code points.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _needs_escape(char: str) -> bool:
    return unicodedata.category(char) in _ESCAPED_CATEGORIES


def printable(text: str) -> str:
    """`text` with every control, format (bidi), separator and unassigned character written as an escape
    (`\\x1b`, `\\u202e`); printable text, non-ASCII letters included, stays as it is."""
    if text.isascii() and text.isprintable():  # the common case, checked in C
        return text
    return "".join(_escape(c) if _needs_escape(c) else c for c in text)
