"""`text.printable`: tenant text shown to a person, with nothing a terminal would interpret."""

from __future__ import annotations

import unicodedata

import pytest

from vramguard.text import printable


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        pytest.param("trainer-7d9f", "trainer-7d9f", id="plain-ascii-unchanged"),
        pytest.param("학습-파드 ünïcode 日本", "학습-파드 ünïcode 日本", id="letters-of-any-script-unchanged"),
        pytest.param("a\x1b[2J\x1b[Hb", "a\\x1b[2J\\x1b[Hb", id="clear-screen-sequence"),
        pytest.param("bell\x07", "bell\\x07", id="bel"),
        pytest.param("evil\u202eexe.txt", "evil\\u202eexe.txt", id="right-to-left-override"),
        pytest.param("x\u200fy\u2066z\u2069", "x\\u200fy\\u2066z\\u2069", id="bidi-marks-and-isolates"),
        pytest.param("line\nforged\rline\ttab", "line\\x0aforged\\x0dline\\x09tab", id="newline-return-tab"),
        pytest.param("c1\x9b31m", "c1\\x9b31m", id="c1-control-sequence-introducer"),
        pytest.param("zero\u200bwidth", "zero\\u200bwidth", id="zero-width-space"),
        pytest.param("tag\U000e0041", "tag\\U000e0041", id="tag-character"),
        pytest.param("sep\u2028arator", "sep\\u2028arator", id="line-separator"),
        pytest.param("del\x7f", "del\\x7f", id="delete"),
        pytest.param("caf\udce9", "caf\\udce9", id="undecodable-byte-as-surrogate"),
        pytest.param("own\ue000use", "own\\ue000use", id="private-use"),
        pytest.param("C:\\x1b\\u202e", "C:\\x1b\\u202e", id="backslashes-written-by-the-tenant-unchanged"),
    ],
)
def test_printable(text: str, shown: str) -> None:
    """Controls, bidi and other format characters become escapes; everything a person reads stays."""
    assert printable(text) == shown


def test_nothing_interpretable_is_left_in_any_code_point() -> None:
    """Over the whole Basic Multilingual Plane, the result holds no control, format or separator character."""
    text = "".join(chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF)
    assert not {unicodedata.category(c) for c in printable(text)} & {"Cc", "Cf", "Zl", "Zp", "Cn", "Co"}


def test_printable_text_is_shown_as_it_is() -> None:
    """Escaping what is already escaped changes nothing: a table escapes a command line that was escaped and cut."""
    text = "".join(chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF)
    once = printable(text)
    assert printable(once) == once
