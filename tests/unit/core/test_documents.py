"""Strict documents: one set of rules for YAML and JSON (size, depth, aliases, merge keys, tags, duplicate keys), each
fault a DocumentError naming its line."""

from __future__ import annotations

import json

import pytest

from vramguard.core.documents import (
    MAX_DEPTH,
    YAML_PARSERS,
    DocumentError,
    Scalars,
    load_json,
    load_yaml,
)

BOMB = b"""\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def nested(levels: int) -> bytes:
    """`levels` lists, one inside the other, in a mapping: `levels + 1` collections deep."""
    return b'{"a": ' + b"[" * levels + b"]" * levels + b"}"


def load(kind: str, data: bytes, parser: str, **kwargs: object) -> object:
    if kind == "json":
        return load_json(data, **kwargs)  # type: ignore[arg-type]
    return load_yaml(data, parser=parser, **kwargs)  # type: ignore[arg-type]


REFUSED = [
    pytest.param("yaml", b"a: " + b"x" * 100, {"max_bytes": 64}, r"^103B is over the 64B bound$", id="size-yaml"),
    pytest.param("json", b'{"a": "' + b"x" * 100 + b'"}', {"max_bytes": 64}, r"^109B is over", id="size-json"),
    pytest.param("yaml", nested(MAX_DEPTH), {}, r"^line 1: nested deeper than 64 levels$", id="depth-yaml"),
    pytest.param("json", nested(MAX_DEPTH), {}, r"^line 1: nested deeper than 64 levels$", id="depth-json"),
    pytest.param(
        "json",
        b'{"a":\n' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        {},
        r"^line 2: nested deeper than 64 levels$",
        id="depth-json-past-the-interpreter-s-recursion",
    ),
    pytest.param("yaml", BOMB, {}, r"^line 1: YAML anchors and aliases are not allowed$", id="anchor-yaml"),
    pytest.param("yaml", b"a: 1\nb: *x\n", {}, r"^line 2: YAML aliases are not allowed$", id="alias-yaml"),
    pytest.param(
        "yaml",
        b"base: {mode: kill}\nteam:\n  <<: {mode: warn}\n",
        {},
        r"^line 3: YAML merge keys \(<<\) are not allowed",
        id="merge-key-yaml",
    ),
    pytest.param("yaml", b"a: !!python/object:os.system {}\n", {}, r"^line 1: YAML tag .* is not supported", id="tag"),
    pytest.param("yaml", b"a: !!binary aGk=\n", {}, r"^line 1: YAML tag .*binary is not supported", id="binary-tag"),
    pytest.param("yaml", b"a:\n  b: 1\n  b: 2\n", {}, r"^line 3: duplicate key 'b'$", id="duplicate-key-yaml"),
    pytest.param("json", b'{"a": {"b": 1,\n "b": 2}}', {}, r"^line 2: duplicate key 'b'$", id="duplicate-key-json"),
    pytest.param(
        "json", b'{"a": 1,\n "a": {"b": [1, {"c": 1, "c": 2}]}}', {}, r"^line 2: duplicate key 'a'$", id="first-dup"
    ),
    pytest.param(
        "json", b'{"a\\"b": 1,\n "a\\"b": 2}', {}, r"^line 2: duplicate key 'a\"b'$", id="duplicate-escaped-key"
    ),
    pytest.param("yaml", b"a: 1\n---\nb: 2\n", {}, r"^line 2: more than one YAML document$", id="two-documents-yaml"),
    pytest.param("json", b'{"a": 1}\n{"b": 2}', {}, r"^line 2, column 1: Extra data$", id="two-documents-json"),
    pytest.param("yaml", b"a: [1,\nb: 2\n", {}, r"^line 3, column 1: .*expected .,. or .\]", id="syntax-yaml"),
    pytest.param("json", b'{"a": [1,\n"b"}', {}, r"^line 2, column 4: Expecting", id="syntax-json"),
    pytest.param("yaml", b"a: 1\nb: \xff\n", {}, r"^line 2: .*(invalid|utf-8)", id="not-utf8-yaml"),
    pytest.param("json", b'{"a": 1,\n"b": "\xff"}', {}, r"^line 2: not UTF-8", id="not-utf8-json"),
]


@pytest.mark.parametrize("parser", YAML_PARSERS)
@pytest.mark.parametrize(("kind", "data", "kwargs", "message"), REFUSED)
def test_documents_breaking_a_rule_are_refused_naming_the_line(
    kind: str, data: bytes, kwargs: dict[str, object], message: str, parser: str
) -> None:
    """Size, depth, anchors and aliases, merge keys, tags, duplicate keys, documents, syntax: one DocumentError,
    naming the line wherever the fault has one, from either YAML parser."""
    with pytest.raises(DocumentError, match=message):
        load(kind, data, parser, **kwargs)


@pytest.mark.parametrize("parser", YAML_PARSERS)
@pytest.mark.parametrize(
    ("kind", "data", "value"),
    [
        pytest.param("yaml", nested(MAX_DEPTH - 1), json.loads(nested(MAX_DEPTH - 1)), id="depth-at-bound-yaml"),
        pytest.param("json", nested(MAX_DEPTH - 1), json.loads(nested(MAX_DEPTH - 1)), id="depth-at-bound-json"),
        pytest.param("json", b'{"<<": {"a": "*a"}}', {"<<": {"a": "*a"}}, id="json-has-no-merge-keys-or-aliases"),
        pytest.param("yaml", b'"<<": 1\n', {"<<": 1}, id="quoted-merge-key-is-text"),
        pytest.param("yaml", b"a: !!str 1\nb: !!seq [c]\n", {"a": "1", "b": ["c"]}, id="a-node-s-own-tag"),
        pytest.param("yaml", b"a: {b: 1}\nc: {b: 2}\n", {"a": {"b": 1}, "c": {"b": 2}}, id="same-key-two-mappings"),
        pytest.param("json", b'{"a": {"b": 1}, "c": {"b": 2}}', {"a": {"b": 1}, "c": {"b": 2}}, id="same-key-json"),
        pytest.param("yaml", b"", None, id="empty-yaml"),
        pytest.param("json", b'\xef\xbb\xbf{"a": 1}', {"a": 1}, id="json-byte-order-mark"),
    ],
)
def test_documents_within_the_rules_load(kind: str, data: bytes, value: object, parser: str) -> None:
    """A document as deep as the bound, text that only looks like a YAML construct, a node's own tag: loaded."""
    assert load(kind, data, parser) == value


@pytest.mark.parametrize("parser", YAML_PARSERS)
@pytest.mark.parametrize(
    ("text", "scalars", "value"),
    [
        pytest.param(
            "[1.50, 0x10, 010, 2026-01-01, yes, ~, 42]",
            Scalars.KUBECTL,
            ["1.50", "0x10", "010", "2026-01-01", True, None, 42],
            id="kubectl-types-null-bool-int-only",
        ),
        pytest.param("[1.50, 0x10, yes, ~, 42]", Scalars.YAML_1_1, [1.5, 16, True, None, 42], id="yaml-1-1-types-all"),
        pytest.param("[=]", Scalars.YAML_1_1, ["="], id="yaml-1-1-value-key-is-text"),
    ],
)
def test_plain_scalars_are_typed_as_asked(text: str, scalars: Scalars, value: list[object], parser: str) -> None:
    """kubectl's typing keeps quantities as written ("1.50"); YAML 1.1's (the policy's) reads numbers too."""
    assert load_yaml(text.encode(), scalars=scalars, parser=parser) == value


@pytest.mark.parametrize("parser", YAML_PARSERS)
def test_streamed_items_are_handed_over_as_read_with_their_lines(parser: str) -> None:
    """Each element of the root's `items` list reaches on_item with its index and line, and is None in the value;
    a nested `items` list is not streamed."""
    seen: list[tuple[object, int, int]] = []
    data = b"kind: List\nitems:\n- {a: 1}\n- b\n- items: [c]\n"
    root = load_yaml(data, parser=parser, on_item=lambda item, index, line: seen.append((item, index, line)))
    assert seen == [({"a": 1}, 0, 3), ("b", 1, 4), ({"items": ["c"]}, 2, 5)]
    assert root == {"kind": "List", "items": [None, None, None]}


@pytest.mark.parametrize("parser", YAML_PARSERS)
def test_an_item_s_fault_ends_the_load_before_a_later_syntax_error(parser: str) -> None:
    """What on_item raises propagates as it is, before the parser reaches a fault further down."""

    class Refused(Exception):
        pass

    def refuse(item: object, index: int, line: int) -> None:
        raise Refused(f"line {line}: items[{index}]")

    with pytest.raises(Refused, match=r"^line 2: items\[0\]$"):
        load_yaml(b"items:\n- pod\n- {unclosed\n", parser=parser, on_item=refuse)


def test_merge_key_in_a_sequence_is_plain_text() -> None:
    """`<<` is refused as a mapping key only: as a list element it is a string like any other."""
    assert load_yaml(b"- <<\n", scalars=Scalars.YAML_1_1) == ["<<"]


def test_error_names_line_and_column_separately() -> None:
    """A DocumentError carries its place as data, for a caller that wants more than the text."""
    with pytest.raises(DocumentError) as info:
        load_json(b'{\n "a": }')
    assert (info.value.line, info.value.column, info.value.problem) == (2, 7, "Expecting value")
