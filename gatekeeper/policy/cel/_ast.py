"""A compiled CEL expression read back from the runtime: the checked syntax tree, what each name
refers to, each node's type and its position in the source (``cel.expr.CheckedExpr``).

``Expression.serialize()`` of cel-expr-python gives a ``google.protobuf.Any`` that holds the
checker's ``CheckedExpr`` (cel-spec ``checked.proto`` and ``syntax.proto``). It is read here with
the project's own protobuf wire reader: the facts the policy needs about an expression (which
variables it reads, whether it reads ``oldObject``, what a field path names, what it may cost)
come from the tree the runtime will evaluate, never from the expression's text.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.codec.protowire import BYTES, FIXED64, Field, ProtobufError, fields, varint_of

__all__ = [
    "DYN",
    "CelType",
    "Checked",
    "Comprehension",
    "Entry",
    "Node",
    "NodeKind",
    "read_checked",
]

_CHECKED_EXPR = "type.googleapis.com/cel.expr.CheckedExpr"
_PARSED_EXPR = "type.googleapis.com/cel.expr.ParsedExpr"
_INT64 = 1 << 63


class NodeKind(enum.Enum):
    CONST = "const"
    IDENT = "ident"
    SELECT = "select"
    CALL = "call"
    LIST = "list"
    MAP = "map"
    COMPREHENSION = "comprehension"


@dataclass(frozen=True, slots=True)
class CelType:
    """A checked type: ``kind`` (``dyn``, ``null``, ``bool``, ``int``, ``uint``, ``double``,
    ``string``, ``bytes``, ``wrapper``, ``list``, ``map``, ``message``, ``type``, ``error``,
    ``abstract``, ``param``, ``any``, ``timestamp``, ``duration``, ``function``), its type
    parameters (a list's element, a map's key and value, a wrapper's primitive) and a name."""

    kind: str
    params: tuple[CelType, ...] = ()
    name: str = ""

    def __str__(self) -> str:
        if self.kind in ("list", "map", "wrapper", "abstract") and self.params:
            inner = ", ".join(str(param) for param in self.params)
            return f"{self.name or self.kind}({inner})"
        return self.name or self.kind

    @property
    def scalar(self) -> bool:
        """A value of constant size (a number, a bool, null, a time)."""
        return self.kind in ("null", "bool", "int", "uint", "double", "timestamp", "duration")


DYN = CelType("dyn")


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a map literal (``key`` may be None for a message field, ``name`` then)."""

    key: Node | None
    value: Node
    optional: bool = False
    name: str = ""


@dataclass(frozen=True, slots=True)
class Comprehension:
    """A loop, as the parser expands ``all``, ``exists``, ``map``, ``filter``, ``cel.bind``…"""

    iter_var: str
    iter_range: Node
    accu_var: str
    accu_init: Node
    loop_condition: Node
    loop_step: Node
    result: Node
    iter_var2: str = ""


@dataclass(frozen=True, slots=True)
class Node:
    """One node of the checked tree. ``name`` is an identifier's name, a selected field or a
    called function; ``operand`` a select's operand or a call's target (``x.f()``); ``args`` a
    call's arguments or a list's elements."""

    id: int
    kind: NodeKind
    name: str = ""
    value: Any = None
    """A constant's value (None also for the constant null)."""
    operand: Node | None = None
    args: tuple[Node, ...] = ()
    entries: tuple[Entry, ...] = ()
    loop: Comprehension | None = None
    test_only: bool = False
    """A select written as ``has(x.f)``."""
    optional_indices: tuple[int, ...] = ()

    def children(self) -> Iterator[Node]:
        """Every node directly below this one."""
        if self.operand is not None:
            yield self.operand
        yield from self.args
        for entry in self.entries:
            if entry.key is not None:
                yield entry.key
            yield entry.value
        if self.loop is not None:
            loop = self.loop
            yield from (loop.iter_range, loop.accu_init, loop.loop_condition, loop.loop_step)
            yield loop.result

    def walk(self) -> Iterator[Node]:
        """This node and every node below it, parents first."""
        pending = [self]
        while pending:
            node = pending.pop()
            yield node
            pending.extend(reversed(list(node.children())))


@dataclass(frozen=True, slots=True)
class Checked:
    """A checked expression: its tree, the declaration each identifier resolved to (global
    variables by their full name, ``variables.node``; comprehension variables by theirs), the
    overloads each call resolved to, each node's type, and each node's offset (in code points)
    in the source."""

    root: Node
    references: Mapping[int, str] = field(default_factory=dict)
    overloads: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    types: Mapping[int, CelType] = field(default_factory=dict)
    positions: Mapping[int, int] = field(default_factory=dict)

    def type_of(self, node: Node) -> CelType:
        return self.types.get(node.id, DYN)

    def scoped(self) -> Iterator[tuple[Node, frozenset[str]]]:
        """Every node, with the comprehension variables in scope where it is: an identifier
        that is not one of them names a declaration."""
        stack: list[tuple[Node, frozenset[str]]] = [(self.root, frozenset())]
        while stack:
            node, local = stack.pop()
            yield node, local
            if node.loop is not None:
                loop = node.loop
                inner = local | {loop.iter_var, loop.iter_var2, loop.accu_var}
                stack += [(loop.iter_range, local), (loop.accu_init, local)]
                stack += [(loop.loop_condition, inner), (loop.loop_step, inner)]
                stack.append((loop.result, local | {loop.accu_var}))
            else:
                stack.extend((child, local) for child in node.children())


def read_checked(serialized: bytes) -> Checked:
    """The ``CheckedExpr`` inside ``Expression.serialize()`` (or the ``ParsedExpr`` of one
    compiled without a check: its tree and positions only); ValueError if it is neither."""
    try:
        outer = _by_number(serialized, "Any")
        kind = _text(serialized, outer.get(1))
        data = _payload(serialized, outer.get(2))
        if kind == _PARSED_EXPR:
            parsed = _by_number(data, "ParsedExpr")
            return Checked(_expr(_payload(data, parsed.get(2))),
                           positions=_positions(_payload(data, parsed.get(3))))  # fmt: skip
        if kind != _CHECKED_EXPR:
            raise ValueError(f"not a {_CHECKED_EXPR}: {kind}")
        return _checked(data)
    except ProtobufError as exc:
        raise ValueError(f"unreadable checked expression: {exc}") from None


# --- the wire format ------------------------------------------------------------------------------


def _by_number(data: bytes, what: str) -> dict[int, Field]:
    """The last occurrence of each field (protobuf's rule for a singular field)."""
    return {item.number: item for item in fields(data, what)}


def _payload(data: bytes, item: Field | None) -> bytes:
    if item is None:
        return b""
    if item.wire_type != BYTES:
        raise ProtobufError(f"field {item.number} is not length-delimited")
    return data[item.value_start : item.end]


def _text(data: bytes, item: Field | None) -> str:
    return _payload(data, item).decode("utf-8")


def _int(data: bytes, item: Field | None) -> int:
    """An int64 or int32 field (two's complement in a uint64 varint)."""
    if item is None:
        return 0
    value = varint_of(data, item, "int")
    return value - (1 << 64) if value >= _INT64 else value


def _repeated(data: bytes, number: int) -> Iterator[bytes]:
    for item in fields(data, "message"):
        if item.number == number:
            yield _payload(data, item)


def _checked(data: bytes) -> Checked:
    top = _by_number(data, "CheckedExpr")
    references: dict[int, str] = {}
    overloads: dict[int, tuple[str, ...]] = {}
    for entry in _repeated(data, 2):
        key, value = _map_entry(entry)
        reference = _payload(entry, value)
        ref_fields = list(fields(reference, "Reference"))
        names = [f for f in ref_fields if f.number == 1]
        if names:
            references[key] = _text(reference, names[-1])
        ids = tuple(_text(reference, f) for f in ref_fields if f.number == 3)
        if ids:
            overloads[key] = ids
    types: dict[int, CelType] = {}
    for entry in _repeated(data, 3):
        key, value = _map_entry(entry)
        types[key] = _type(_payload(entry, value))
    root = _expr(_payload(data, top.get(4)))
    return Checked(root, references, overloads, types, _positions(_payload(data, top.get(5))))


def _positions(source_info: bytes) -> dict[int, int]:
    positions: dict[int, int] = {}
    for entry in _repeated(source_info, 4):
        key, value = _map_entry(entry)
        positions[key] = _int(entry, value)
    return positions


def _map_entry(entry: bytes) -> tuple[int, Field | None]:
    """A ``map<int64, …>`` entry: its key and the field holding its value."""
    found = _by_number(entry, "map entry")
    return _int(entry, found.get(1)), found.get(2)


_PRIMITIVES = {0: "dyn", 1: "bool", 2: "int", 3: "uint", 4: "double", 5: "string", 6: "bytes"}
_WELL_KNOWN = {0: "dyn", 1: "any", 2: "timestamp", 3: "duration"}


def _type(data: bytes) -> CelType:
    found = _by_number(data, "Type")
    if not found:
        return DYN
    number = max(found)  # a oneof: one field is set
    item = found[number]
    if number == 2:
        return CelType("null")
    if number == 3:
        return CelType(_PRIMITIVES.get(varint_of(data, item, "primitive"), "dyn"))
    if number == 4:
        inner = CelType(_PRIMITIVES.get(varint_of(data, item, "wrapper"), "dyn"))
        return CelType("wrapper", (inner,))
    if number == 5:
        return CelType(_WELL_KNOWN.get(varint_of(data, item, "well_known"), "dyn"))
    payload = _payload(data, item)
    if number == 6:
        return CelType("list", (_type(_payload(payload, _by_number(payload, "list").get(1))),))
    if number == 7:
        parts = _by_number(payload, "map")
        key, value = (_type(_payload(payload, parts.get(n))) for n in (1, 2))
        return CelType("map", (key, value))
    if number == 8:
        return CelType("function")
    if number == 9:
        return CelType("message", name=payload.decode("utf-8"))
    if number == 10:
        return CelType("param", name=payload.decode("utf-8"))
    if number == 11:
        return CelType("type", (_type(payload),))
    if number == 12:
        return CelType("error")
    if number == 14:
        parts = _by_number(payload, "abstract")
        params = tuple(_type(p) for p in _repeated(payload, 2))
        return CelType("abstract", params, _text(payload, parts.get(1)))
    return DYN  # google.protobuf.Empty dyn (1), and any kind this reader does not know


def _expr(data: bytes) -> Node:
    found = _by_number(data, "Expr")
    ident = _int(data, found.get(2))
    kinds = [number for number in found if number >= 3]
    if not kinds:
        raise ProtobufError(f"expression {ident} has no kind")
    number = kinds[-1]
    payload = _payload(data, found[number])
    if number == 3:
        return Node(ident, NodeKind.CONST, value=_constant(payload))
    if number == 4:
        return Node(ident, NodeKind.IDENT, _text(payload, _by_number(payload, "ident").get(1)))
    if number == 5:
        parts = _by_number(payload, "select")
        test_only = 3 in parts and varint_of(payload, parts[3], "test_only") != 0
        operand = _expr(_payload(payload, parts.get(1)))
        return Node(ident, NodeKind.SELECT, _text(payload, parts.get(2)), operand=operand,
                    test_only=test_only)  # fmt: skip
    if number == 6:
        parts = _by_number(payload, "call")
        target = _expr(_payload(payload, parts[1])) if 1 in parts else None
        args = tuple(_expr(arg) for arg in _repeated(payload, 3))
        return Node(ident, NodeKind.CALL, _text(payload, parts.get(2)), operand=target, args=args)
    if number == 7:
        elements = tuple(_expr(element) for element in _repeated(payload, 1))
        optional = tuple(_optional_indices(payload))
        return Node(ident, NodeKind.LIST, args=elements, optional_indices=optional)
    if number == 8:
        return Node(ident, NodeKind.MAP, _text(payload, _by_number(payload, "struct").get(1)),
                    entries=tuple(_entry(entry) for entry in _repeated(payload, 2)))  # fmt: skip
    if number == 9:
        return Node(ident, NodeKind.COMPREHENSION, loop=_comprehension(payload))
    raise ProtobufError(f"expression {ident} has an unknown kind {number}")


def _optional_indices(payload: bytes) -> Iterator[int]:
    for item in fields(payload, "list"):
        if item.number != 2:
            continue
        if item.wire_type == BYTES:  # packed
            raw = _payload(payload, item)
            pos = 0
            while pos < len(raw):
                shift = value = 0
                while True:
                    byte = raw[pos]
                    pos += 1
                    value |= (byte & 0x7F) << shift
                    shift += 7
                    if not byte & 0x80:
                        break
                yield value
        else:
            yield varint_of(payload, item, "optional index")


def _entry(data: bytes) -> Entry:
    parts = _by_number(data, "entry")
    value = _expr(_payload(data, parts.get(4)))
    optional = 5 in parts and varint_of(data, parts[5], "optional_entry") != 0
    if 3 in parts:
        return Entry(_expr(_payload(data, parts[3])), value, optional)
    return Entry(None, value, optional, _text(data, parts.get(2)))


def _comprehension(data: bytes) -> Comprehension:
    parts = _by_number(data, "comprehension")

    def sub(number: int) -> Node:
        return _expr(_payload(data, parts.get(number)))

    return Comprehension(
        iter_var=_text(data, parts.get(1)),
        iter_range=sub(2),
        accu_var=_text(data, parts.get(3)),
        accu_init=sub(4),
        loop_condition=sub(5),
        loop_step=sub(6),
        result=sub(7),
        iter_var2=_text(data, parts.get(8)),
    )


def _constant(data: bytes) -> Any:
    found = _by_number(data, "Constant")
    if not found:
        return None
    number = max(found)
    item = found[number]
    if number == 1:
        return None
    if number == 2:
        return varint_of(data, item, "bool") != 0
    if number == 3:
        return _int(data, item)
    if number == 4:
        return varint_of(data, item, "uint")
    if number == 5:
        if item.wire_type != FIXED64:
            raise ProtobufError("a double constant is not fixed64")
        return struct.unpack("<d", data[item.value_start : item.end])[0]
    if number == 6:
        return _text(data, item)
    if number == 7:
        return _payload(data, item)
    return None  # durations and timestamps (deprecated constants): not produced by the parser
