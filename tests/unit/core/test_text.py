"""`vramguard.core.text`: tenant text shown to a person bounded and with nothing a terminal would interpret; values
quoted; byte counts in binary units."""

from __future__ import annotations

import unicodedata

import pytest

from vramguard.core.text import cut, format_bytes, printable, show_value


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


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        pytest.param("x" * 30, 30, "x" * 30, id="at-the-limit-unchanged"),
        pytest.param("x" * 40, 30, "x" * 7 + "...[cut: 40 characters]", id="over-the-limit-says-how-long"),
        pytest.param("x" * 10_000_000, 1024, "x" * 995 + "...[cut: 10000000 characters]", id="ten-megabytes"),
    ],
)
def test_cut_keeps_the_head_and_says_how_long_the_text_was(text: str, limit: int, expected: str) -> None:
    """cut keeps the head of a text over the limit and says how long it was, never passing the limit."""
    assert cut(text, limit) == expected
    assert len(cut(text, limit)) <= limit


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("x" * 78, '"' + "x" * 78 + '"', id="fits-exactly-unchanged"),
        pytest.param("x" * 79, '"' + "x" * 55 + '...[cut: 79 characters]"', id="one-over-is-cut-inside-its-quotes"),
        pytest.param(
            "x" * 10_000_000, '"' + "x" * 49 + '...[cut: 10000000 characters]"', id="ten-megabytes-cut-to-the-limit"
        ),
        pytest.param("\n" * 100, '"' + "\\n" * 27 + "\\...[cut: 134 characters]", id="escapes-count-against-the-limit"),
        pytest.param(" 1Gi", '" 1Gi"', id="padding-visible"),
        pytest.param(None, "null", id="null"),
        pytest.param(True, "true", id="boolean"),
        pytest.param(1.5, "1.5", id="number"),
        pytest.param({"a": [1]}, '{"a": [1]}', id="mapping-as-json"),
    ],
)
def test_show_value_quotes_and_is_bounded(value: object, expected: str) -> None:
    """show_value reads as YAML or JSON would, and never returns more than its limit however long the value."""
    assert show_value(value) == expected
    assert len(show_value(value)) <= 80


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        pytest.param(0, "0B", id="zero"),
        pytest.param(1023, "1023B", id="bytes"),
        pytest.param(1536, "1.5KiB", id="kibibytes"),
        pytest.param(10 * 1024**3, "10.0GiB", id="gibibytes"),
        pytest.param(3 * 1024**4, "3.0TiB", id="tebibytes"),
    ],
)
def test_format_bytes(n: int, expected: str) -> None:
    """format_bytes writes bytes in the largest binary unit that fits, with one decimal above bytes."""
    assert format_bytes(n) == expected
