"""Strict YAML and JSON documents: one set of rules for every file vramguard reads (the policy, the pods file).

Pure: it parses the bytes it is given, on PyYAML's public loader classes and `json.loads`. The rules, the same for
both formats wherever the format has the construct:

- at most `max_bytes` (`MAX_BYTES` unless the caller bounds it tighter);
- collections nested at most `MAX_DEPTH` deep, so no value is deep enough for str() or == to recurse through;
- no YAML anchors or aliases, so nothing expands (no "billion laughs");
- no YAML merge keys (`<<`): a key comes from the line that writes it;
- no YAML tags but a node's own kind's (`!!python/object`, `!!binary`, `!!set` are never constructed);
- one YAML document;
- no duplicate keys (plain `yaml.safe_load` and `json.loads` keep the last one without a word).

Every error is a `DocumentError` that names the line wherever the fault has one.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Final

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.reader import ReaderError
from yaml.resolver import BaseResolver, Resolver

from vramguard.core.quantity import MiB
from vramguard.core.text import cut, format_bytes

# 5,000 pods as `kubectl get pods -o json` are about 35 MB; the bound leaves room for that and stops a runaway file.
MAX_BYTES: Final = 64 * MiB
# kubectl's deepest Pod field is about 12 levels down (in managedFields); a policy's is 4.
MAX_DEPTH: Final = 64

OnItem = Callable[[object, int, int], None]
"""Called with each streamed item, its index in the list and the line it starts on."""


class DocumentError(ValueError):
    """A document that breaks a rule or is not YAML/JSON: "line 3: duplicate key 'mode'"."""

    def __init__(self, problem: str, line: int | None = None, column: int | None = None) -> None:
        self.problem = problem
        self.line = line
        self.column = column
        where = "" if line is None else f"line {line}: " if column is None else f"line {line}, column {column}: "
        super().__init__(where + problem)


class Scalars(enum.Enum):
    """How YAML plain scalars are typed (JSON's are typed by its syntax)."""

    KUBECTL = "kubectl"  # null, booleans and decimal integers; the rest (floats, octal, timestamps) text as written
    YAML_1_1 = "yaml-1.1"  # PyYAML's safe typing: floats, octal and hex, timestamps too


# --------------------------------------------------------------------------------------------------------------
# JSON


def load_json(data: bytes, *, max_bytes: int = MAX_BYTES) -> object:
    """The value of a JSON document (UTF-8, a byte-order mark allowed). Raises DocumentError."""
    _check_size(data, max_bytes)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DocumentError(f"not UTF-8 ({e.reason})", _line_at(data, e.start)) from None
    try:
        root = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey:
        raise _json_fault(text) from None
    except json.JSONDecodeError as e:
        raise DocumentError(e.msg, e.lineno, e.colno) from None
    except RecursionError:
        raise _json_fault(text) from None
    if _deeper_than(root, MAX_DEPTH):
        raise _json_fault(text)
    return root


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKey  # json.loads cannot say where: `_json_fault` finds it
    return obj


def _deeper_than(root: object, depth: int) -> bool:
    """Whether `root` holds collections nested more than `depth` deep (walked without recursion)."""
    stack = [(root, 1)]
    while stack:
        value, level = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        if level > depth:
            return True
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return False


# A JSON string, or a bracket or colon outside one: all that locating a key or a level needs.
_JSON_TOKEN: Final = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:]')


def _json_fault(text: str) -> DocumentError:
    """The first duplicate key or too deep a collection in `text`, with its line: what json.loads found without a
    place. Only the part of `text` before the fault is read, and json.loads has parsed that part."""
    open_keys: list[set[str] | None] = []  # for each open collection: an object's keys so far, None for a list
    last_string: tuple[str, int] | None = None
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token in ("{", "["):
            if len(open_keys) >= MAX_DEPTH:
                return DocumentError(f"nested deeper than {MAX_DEPTH} levels", _line_at(text, match.start()))
            open_keys.append(set() if token == "{" else None)
        elif token in ("}", "]"):
            if open_keys:
                open_keys.pop()
        elif token == ":":
            keys = open_keys[-1] if open_keys else None
            if keys is not None and last_string is not None:
                key = json.loads(last_string[0])
                if key in keys:
                    return DocumentError(f"duplicate key {cut(repr(key), 100)}", _line_at(text, last_string[1]))
                keys.add(key)
        else:
            last_string = (token, match.start())
    return DocumentError(f"nested deeper than {MAX_DEPTH} levels")  # json.loads gave up first, at its own limit


# --------------------------------------------------------------------------------------------------------------
# YAML

_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_NULL_TAG: Final = "tag:yaml.org,2002:null"
# The explicit tags a node may carry: "!" (non-specific) and its own kind's.
_ALLOWED_TAGS: Final[Mapping[type[yaml.Event], frozenset[str | None]]] = {
    yaml.ScalarEvent: frozenset({None, "!", "tag:yaml.org,2002:str"}),
    yaml.SequenceStartEvent: frozenset({None, "!", "tag:yaml.org,2002:seq"}),
    yaml.MappingStartEvent: frozenset({None, "!", "tag:yaml.org,2002:map"}),
}


class _KubectlScalars(BaseResolver):
    yaml_implicit_resolvers: dict[Any, Any] = {}  # noqa: RUF012 (PyYAML's class-level table, filled below)


_KubectlScalars.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"),
    list("yYnNtTfFoO"),
)
_KubectlScalars.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]{0,18})$"), list("-+0123456789")
)
_KubectlScalars.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)

# `<<` is refused where it is composed, and `=` (YAML 1.1's value key) has no safe constructor: both stay text.
_RESOLVERS: Final[Mapping[Scalars, dict[Any, Any]]] = {
    Scalars.KUBECTL: _KubectlScalars.yaml_implicit_resolvers,
    Scalars.YAML_1_1: {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_MERGE_TAG, "tag:yaml.org,2002:value")]
        for first, resolvers in Resolver.yaml_implicit_resolvers.items()
    },
}


class _Checks(Composer, SafeConstructor):
    """PyYAML's composer with the rules checked on each event before its node exists, and its safe constructor
    refusing duplicate keys. With `on_item`, each element of the root mapping's `items_key` list is constructed
    and handed over as soon as it is composed, so a file's nodes are held one item at a time (a node costs tens of
    times its text)."""

    # Given by the parser each loader below is built on (PyYAML's Parser or libyaml's CParser).
    peek_event: Callable[[], Any]
    check_event: Callable[..., bool]
    get_event: Callable[[], Any]

    def __init__(self, scalars: Scalars, on_item: OnItem | None, items_key: str) -> None:
        Composer.__init__(self)
        self.yaml_implicit_resolvers = _RESOLVERS[scalars]
        self.on_item = on_item
        self.items_key = items_key
        self.depth = 0  # of the collections being composed
        self.in_items = False  # composing the streamed list

    def get_single_node(self) -> Node | None:
        self.get_event()  # the stream's start
        node = None if self.check_event(yaml.StreamEndEvent) else self.compose_document()
        if not self.check_event(yaml.StreamEndEvent):
            raise DocumentError("more than one YAML document", self.peek_event().start_mark.line + 1)
        return node

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise DocumentError("YAML aliases are not allowed", line)
        if event.anchor is not None:
            raise DocumentError("YAML anchors and aliases are not allowed", line)
        if event.tag not in _ALLOWED_TAGS[type(event)]:
            raise DocumentError(f"YAML tag {cut(event.tag, 100)} is not supported", line)
        # A mapping's keys are composed with no index, its values with their key's node.
        if isinstance(parent, MappingNode) and index is None and _is_merge_key(event):
            raise DocumentError("YAML merge keys (<<) are not allowed: write each key out", line)
        if self.in_items and self.depth == 2 and self.on_item is not None:
            item = self.construct_document(self._compose(parent, index, event, line))
            self.on_item(item, index, line)
            return ScalarNode(_NULL_TAG, "", event.start_mark, event.start_mark)  # constructs as None
        # The root mapping's values are composed at depth 1.
        opens_items = (
            self.depth == 1
            and isinstance(event, yaml.SequenceStartEvent)
            and isinstance(index, ScalarNode)
            and index.value == self.items_key
        )
        self.in_items |= opens_items
        try:
            return self._compose(parent, index, event, line)
        finally:
            if opens_items:
                self.in_items = False

    def _compose(self, parent: Node | None, index: Any, event: Any, line: int) -> Node | None:
        if isinstance(event, yaml.ScalarEvent):
            return super().compose_node(parent, index)
        if self.depth >= MAX_DEPTH:
            raise DocumentError(f"nested deeper than {MAX_DEPTH} levels", line)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        mapping = super().construct_mapping(node, deep=deep)
        if len(mapping) < len(node.value):  # a key repeated: find its second occurrence
            seen: set[Hashable] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node)
                if key in seen:
                    raise DocumentError(f"duplicate key {cut(repr(key), 100)}", key_node.start_mark.line + 1)
                seen.add(key)
        return mapping


def _is_merge_key(event: Any) -> bool:
    plain = isinstance(event, yaml.ScalarEvent) and event.implicit[0]
    return bool(plain and event.value == "<<")


class _PyLoader(_Checks, yaml.BaseLoader):
    def __init__(self, stream: bytes, scalars: Scalars, on_item: OnItem | None, items_key: str) -> None:
        yaml.BaseLoader.__init__(self, stream)
        _Checks.__init__(self, scalars, on_item, items_key)


_LOADERS: dict[str, Callable[[bytes, Scalars, OnItem | None, str], _Checks]] = {"python": _PyLoader}
if yaml.__with_libyaml__:

    class _CLoader(_Checks, yaml.CBaseLoader):
        """libyaml's parser (about 10x faster than PyYAML's) under the same composer: `_Checks` comes first in the
        method order, so its composition is used rather than libyaml's, which would resolve aliases."""

        def __init__(self, stream: bytes, scalars: Scalars, on_item: OnItem | None, items_key: str) -> None:
            yaml.CBaseLoader.__init__(self, stream)
            _Checks.__init__(self, scalars, on_item, items_key)

    _LOADERS = {"libyaml": _CLoader, **_LOADERS}

YAML_PARSERS: Final = tuple(_LOADERS)
"""The YAML parsers at hand, the fastest first: libyaml's where PyYAML was built with it, and PyYAML's own."""


def load_yaml(
    data: bytes,
    *,
    scalars: Scalars = Scalars.KUBECTL,
    max_bytes: int = MAX_BYTES,
    on_item: OnItem | None = None,
    items_key: str = "items",
    parser: str = YAML_PARSERS[0],
) -> object:
    """The value of a one-document YAML stream (None for an empty one). Raises DocumentError.

    With `on_item`, each element of the root mapping's `items_key` list is handed to it as soon as it is read, and
    left None in the value returned; whatever `on_item` raises ends the load and propagates as it is."""
    _check_size(data, max_bytes)
    try:
        loader = _LOADERS[parser](data, scalars, on_item, items_key)  # PyYAML's reader decodes the start here
        try:
            node = loader.get_single_node()
            return None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()  # type: ignore[attr-defined]
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "invalid YAML"
        raise DocumentError(problem, *((mark.line + 1, mark.column + 1) if mark else ())) from None
    except ReaderError as e:  # not UTF-8, or a control character: the position is a byte offset
        raise DocumentError(str(e).splitlines()[0], _line_at(data, e.position)) from None
    except yaml.YAMLError as e:
        raise DocumentError(str(e)) from None


# --------------------------------------------------------------------------------------------------------------


def _check_size(data: bytes, max_bytes: int) -> None:
    if len(data) > max_bytes:
        raise DocumentError(f"{format_bytes(len(data))} is over the {format_bytes(max_bytes)} bound")


def _line_at(text: str | bytes, pos: int) -> int:
    return (text.count("\n", 0, pos) if isinstance(text, str) else text.count(b"\n", 0, pos)) + 1
