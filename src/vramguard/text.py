"""Tenant text made safe to show a person: pod names, annotation values and command lines reach terminals.

A tenant controls those strings. Written raw, an ESC sequence can clear an operator's screen or forge lines, and
a bidirectional override (U+202E) can make `evil` read as `live`. Human-facing output (tables, console logs,
Event messages, error messages) shows such characters as escapes, as kubectl does for terminal sequences;
machine-facing output (JSON) carries the exact text.
"""

from __future__ import annotations

import unicodedata

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
