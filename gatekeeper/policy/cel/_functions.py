"""What each function of the runtime costs beyond its operands, and how large its value may be:
the cost model's table (:mod:`gatekeeper.policy.cel._cost`). Every function the runtime's
environment declares is here (``tests/policy/test_cel_cost.py`` calls each); a call to one that
is not is refused at load (fail closed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gatekeeper.policy.cel._poly import (
    CHAR,
    ELEMENT,
    EQUAL,
    FORMAT,
    ONE,
    REGEX,
    REGEX_COMPILE,
    SCALAR,
    ZERO,
    Poly,
    Sizes,
)

__all__ = ["FUNCTIONS", "Handler", "Smaller"]

Smaller = Callable[[Poly, Poly], Poly]
Handler = Callable[[Sequence[Sizes], str, Smaller], tuple[Poly, Sizes]]


def _free(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    return ZERO, SCALAR


def _passes(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    """One of its operands' values (``orValue``, ``or``, a conditional's branches)."""
    count = deep = ZERO
    for arg in args:
        count, deep = count.most(arg.count), deep.most(arg.deep)
    return ZERO, Sizes(count, deep)


def _first(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    return ZERO, args[0]


def _branches(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    return _passes(args[1:], kind, smaller)


def _equal(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    return smaller(args[0].deep, args[1].deep).scaled(EQUAL), SCALAR


def _order(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    return smaller(args[0].count, args[1].count).scaled(CHAR), SCALAR


def _add(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    count, deep = args[0].count + args[1].count, args[0].deep + args[1].deep
    if kind in ("int", "uint", "double", "timestamp", "duration"):
        return ZERO, SCALAR
    factor = CHAR if kind in ("string", "bytes") else ELEMENT
    return count.scaled(factor), Sizes(count, deep)


def _within(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    """Each element compared with the value: at most all the elements, or the value as many
    times as there are elements."""
    value, collection = args
    return smaller(collection.deep, collection.count * value.deep).scaled(EQUAL), SCALAR


def _search(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    return (args[0].count * args[1].count).scaled(CHAR), SCALAR


def _prefix(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    return args[1].count.scaled(CHAR), SCALAR


def _matches(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    text, pattern = args[0].count, args[1].count
    return (text * pattern).scaled(REGEX) + pattern.scaled(REGEX_COMPILE), SCALAR


def _walks(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    """A string function that walks its target once and gives a string no longer."""
    return args[0].count.scaled(CHAR), Sizes.flat(args[0].count)


def _quote(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    size = args[0].count.scaled(6) + Poly.of(2)  # every character may become \uXXXX
    return size.scaled(CHAR), Sizes.flat(size)


def _replace(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    text, old, new = args[0].count, args[1].count, args[2].count
    size = text * (new + ONE) + new  # an empty pattern matches between every character
    return (text * (old + ONE) + size).scaled(CHAR), Sizes.flat(size)


def _split(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    text, separator = args[0].count, args[1].count
    pieces = text + ONE
    cost = (text * separator).scaled(CHAR) + pieces.scaled(ELEMENT)
    return cost, Sizes(pieces, pieces + text)


def _join(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    separator = args[1].count if len(args) > 1 else ZERO
    size = args[0].deep + args[0].count * separator
    return size.scaled(CHAR), Sizes.flat(size)


def _format(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    size = args[0].count + args[1].deep.scaled(FORMAT)
    return size.scaled(CHAR), Sizes.flat(size)


def _to_string(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    size = args[0].deep.scaled(FORMAT)
    return size.scaled(CHAR), Sizes.flat(size)


def _parse(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    """A conversion that reads its argument once (``int('12')``, ``bytes('x')``…)."""
    cost = args[0].count.scaled(CHAR)
    return cost, Sizes.flat(args[0].count) if kind in ("bytes", "string") else SCALAR


def _base64(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    size = args[0].count.scaled(2) + Poly.of(4)
    return size.scaled(CHAR), Sizes.flat(size)


def _extreme(args: Sequence[Sizes], kind: str, smaller: Smaller) -> tuple[Poly, Sizes]:
    count = ZERO
    for arg in args:
        count = count + arg.count
    return count.scaled(ELEMENT), SCALAR


_FREE = (
    "!_", "-_", "_-_", "_*_", "_/_", "_%_", "_&&_", "_||_", "@not_strictly_false", "size",
    "type", "charAt", "hasValue", "optional.none", "optional.ofNonZeroValue",
    "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getFullYear", "getHours",
    "getMilliseconds", "getMinutes", "getMonth", "getSeconds",
    "math.abs", "math.bitAnd", "math.bitNot", "math.bitOr", "math.bitShiftLeft",
    "math.bitShiftRight", "math.bitXor", "math.ceil", "math.floor", "math.isFinite",
    "math.isInf", "math.isNaN", "math.round", "math.sign", "math.sqrt", "math.trunc",
)  # fmt: skip
FUNCTIONS: dict[str, Handler] = {
    **dict.fromkeys(_FREE, _free),
    **dict.fromkeys(("_[_]", "_[?_]", "_?._", "value", "optional.of", "dyn"), _first),
    **dict.fromkeys(("orValue", "or"), _passes),
    "_?_:_": _branches,
    **dict.fromkeys(("_==_", "_!=_"), _equal),
    **dict.fromkeys(("_<_", "_<=_", "_>_", "_>=_"), _order),
    "_+_": _add,
    "@in": _within,
    **dict.fromkeys(("contains", "indexOf", "lastIndexOf"), _search),
    **dict.fromkeys(("startsWith", "endsWith"), _prefix),
    "matches": _matches,
    **dict.fromkeys(("lowerAscii", "upperAscii", "trim", "reverse", "substring"), _walks),
    "strings.quote": _quote,
    "replace": _replace,
    "split": _split,
    "join": _join,
    "format": _format,
    "string": _to_string,
    **dict.fromkeys(("int", "uint", "double", "bool", "bytes", "timestamp", "duration"), _parse),
    **dict.fromkeys(("base64.encode", "base64.decode"), _base64),
    **dict.fromkeys(("math.@max", "math.@min"), _extreme),
}
