"""What a CEL expression may cost, bounded from its checked tree: a polynomial in the sizes of
what it reads (each path's length, each value's bytes), estimated once when the policy loads.

The runtime (cel-expr-python, Google's C++ CEL) bounds only one thing, the iterations of all
the loops of one evaluation (10,000, not settable from Python), and has no cost tracker. So the
bound is computed here, as the apiserver's estimator does for CRD rules (cel-go
``checker/cost.go``), but in units calibrated against this runtime (about a nanosecond each on
the reference machine; ``bench/cel_bench.py`` checks that the bound holds): every node
evaluated, every loop iteration, every element a list is built with (``map`` and ``filter``
copy their accumulator at each step: quadratic), every character a string function or a
comparison walks, a regular expression's input times its pattern, every byte of the objects
converted into the runtime.

At load the polynomial is evaluated with every size at its largest (an object of
:data:`MAX_OBJECT_BYTES`): an expression over :data:`COST_LIMIT` is refused, with its estimate.
Per request it is evaluated with the sizes of the objects at hand, before anything is
evaluated: over :data:`REQUEST_BUDGET` the request is refused (fail closed), so no evaluation
holds the event loop longer than the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gatekeeper.policy._celast import Checked, Node, NodeKind
from gatekeeper.policy._celenv import OBJECT_ROOTS
from gatekeeper.policy._celreads import EACH, Path, Reads

__all__ = [
    "CHAR",
    "CONVERT",
    "COST_LIMIT",
    "ELEMENT",
    "EQUAL",
    "EVALUATION",
    "FORMAT",
    "ITERATION",
    "MAX_OBJECT_BYTES",
    "NAME_BYTES",
    "NODE",
    "REGEX",
    "REQUEST_BUDGET",
    "REQUEST_BYTES",
    "SUM",
    "UNITS",
    "WALK",
    "CostError",
    "Estimate",
    "Poly",
    "Sizes",
    "describe",
    "estimate",
    "worst",
]

MAX_OBJECT_BYTES = 3 * 1024 * 1024
"""The largest object an expression reads: a request body (the apiserver refuses more), or a
stored object (written through such a body)."""
COST_LIMIT = 10_000_000_000
"""The most one expression may cost on the largest objects, estimated at load (about ten
seconds of this runtime's work): what is linear in its input fits, what is quadratic in it
(``map`` or ``filter`` over a list of the body, a loop inside a loop over the same list) does
not."""
REQUEST_BUDGET = 1_000_000
"""The most the CEL of one request may cost, bounded from its objects' sizes before anything is
evaluated (about a millisecond): no request holds the event loop longer."""

NODE = 50
"""Evaluating one node: a name, a field, a call (measured: about 35 ns)."""
ITERATION = 300
"""One loop iteration, besides its body (about 140 ns)."""
ELEMENT = 100
"""One element of a list or map built, copied or split off (about 50 ns)."""
CHAR = 2
"""One character a string function walks or copies (about 1 ns)."""
EQUAL = 10
"""One unit of a value compared whole (a JSON byte of a list or map)."""
REGEX = 2
"""One character of input times one character of the pattern (RE2 is linear in its input)."""
FORMAT = 32
"""Characters one value may take when formatted as a string."""
CONVERT = 40
"""One byte of an object converted into the runtime (about 20 ns)."""
WALK = 400
"""One mapping or list of an object walked in Python to cut it to what is read."""
EVALUATION = 3000
"""One call into the runtime: its bindings and its result (about 2 µs)."""
NAME_BYTES = 253
"""The longest name a built-in variable or ``request`` holds (a DNS subdomain: a node, a
driver, an object, a ServiceAccount, a pod)."""
REQUEST_BYTES = 2048
"""The largest other value of ``request`` (a group-version-kind, the caller's user info as the
apiserver's TokenReview or the gatekeeper gives it, the options)."""
_NAMES = frozenset(
    {"request.name", "request.namespace", "request.operation", "request.subResource",
     "request.requestSubResource", "request.userInfo.username", "request.userInfo.uid"}
)  # fmt: skip
UNITS = "units (about a nanosecond each)"


class CostError(ValueError):
    """An expression whose cost cannot be bounded (a function the model does not know, an
    accumulator that grows faster than linearly)."""


_Term = tuple[int, ...]
"""The size slots a term multiplies (sorted; a slot may repeat). Slot ``-1`` is an
accumulator's size while a loop is estimated; ``SUM + slot`` the sum of a slot's sizes."""
SUM = 1 << 20
_ACCUMULATOR = -1


class Poly:
    """A polynomial with non-negative coefficients in the size slots."""

    __slots__ = ("terms",)

    def __init__(self, terms: Mapping[_Term, float] | None = None) -> None:
        self.terms: dict[_Term, float] = {t: c for t, c in (terms or {}).items() if c}

    @staticmethod
    def of(value: float) -> Poly:
        return Poly({(): value})

    @staticmethod
    def slot(slot: int) -> Poly:
        return Poly({(slot,): 1.0})

    def __add__(self, other: Poly) -> Poly:
        terms = dict(self.terms)
        for term, coefficient in other.terms.items():
            terms[term] = terms.get(term, 0.0) + coefficient
        return Poly(terms)

    def __mul__(self, other: Poly) -> Poly:
        terms: dict[_Term, float] = {}
        for left, a in self.terms.items():
            for right, b in other.terms.items():
                term = tuple(sorted(left + right))
                terms[term] = terms.get(term, 0.0) + a * b
        return Poly(terms)

    def most(self, other: Poly) -> Poly:
        """A bound of max(self, other): term by term (every term is non-negative)."""
        terms = dict(self.terms)
        for term, coefficient in other.terms.items():
            terms[term] = max(terms.get(term, 0.0), coefficient)
        return Poly(terms)

    def scaled(self, factor: float) -> Poly:
        return Poly({term: c * factor for term, c in self.terms.items()})

    @property
    def constant(self) -> bool:
        return all(not term for term in self.terms)

    @property
    def degree(self) -> int:
        return max((len(term) for term in self.terms), default=0)

    def value(self, sizes: Callable[[int], float]) -> float:
        total = 0.0
        for term, coefficient in self.terms.items():
            product = coefficient
            for slot in term:
                product *= sizes(slot)
            total += product
        return total

    def split(self, slot: int) -> tuple[Poly, Poly, bool]:
        """(the terms without ``slot``, the rest divided by it once, whether it appears twice)."""
        without: dict[_Term, float] = {}
        per: dict[_Term, float] = {}
        twice = False
        for term, coefficient in self.terms.items():
            if slot in term:
                rest = list(term)
                rest.remove(slot)
                twice = twice or slot in rest
                per[tuple(rest)] = per.get(tuple(rest), 0.0) + coefficient
            else:
                without[term] = coefficient
        return Poly(without), Poly(per), twice

    def substitute(self, slot: int, by: Poly) -> Poly:
        out = Poly()
        for term, coefficient in self.terms.items():
            part = Poly({(): coefficient})
            for each in term:
                part = part * (by if each == slot else Poly.slot(each))
            out = out + part
        return out

    def __repr__(self) -> str:
        return " + ".join(f"{c:g}*{'*'.join(map(str, t)) or '1'}" for t, c in self.terms.items())


_ONE = Poly.of(1)
_ZERO = Poly()


@dataclass(frozen=True, slots=True)
class Sizes:
    """A value's bounds: ``count`` its length (characters, elements, entries; 1 for a
    number), ``deep`` everything in it (JSON bytes for a value read from an object)."""

    count: Poly
    deep: Poly

    @staticmethod
    def flat(size: Poly) -> Sizes:
        return Sizes(size, size)


_SCALAR = Sizes(_ONE, _ONE)


@dataclass(frozen=True, slots=True)
class Estimate:
    """What evaluating an expression costs and how large its value may be."""

    cost: Poly
    sizes: Sizes


def estimate(checked: Checked, reads: Reads, variables: Mapping[str, Sizes]) -> Estimate:
    """The cost of evaluating ``checked`` once (its tree as ``reads`` recorded it), the policy
    variables it reads sized by ``variables`` (their own cost is counted where they are
    evaluated); CostError when it cannot be bounded."""
    estimator = _Estimator(checked, reads, variables)
    return estimator.estimate(checked.root, {})


class _Estimator:
    def __init__(self, checked: Checked, reads: Reads, variables: Mapping[str, Sizes]) -> None:
        self.checked, self.reads, self.variables = checked, reads, variables
        self.values = reads.values.get(id(checked), {})
        self.elements: list[str] = []
        """The element paths of the loops being estimated, outermost first."""

    def smaller(self, a: Poly, b: Poly) -> Poly:
        """A bound of min(a, b): either one is. The one that grows least with sizes outside
        the elements of the loops around it (those sum over the loop, see :meth:`_iterations`),
        then the one of lower degree, of fewer terms."""

        def outside(poly: Poly) -> int:
            return max(
                (
                    sum(1 for s in term if not (0 <= s < SUM and self._inside(s)))
                    for term in poly.terms
                ),
                default=0,
            )

        return min((a, b), key=lambda p: (outside(p), p.degree, len(p.terms)))

    def _inside(self, slot: int) -> bool:
        path = self.reads.describe(slot // 2)
        return any(_under(path, element) for element in self.elements)

    def path_sizes(self, paths: frozenset[Path]) -> Sizes:
        """The sizes of a value read from the objects: its length and its bytes, measured per
        request (:class:`~gatekeeper.policy._celreads.Projection`)."""
        count = deep = _ZERO
        for path in sorted(paths):
            slot = self.reads.slot(path)
            count, deep = count + Poly.slot(2 * slot), deep + Poly.slot(2 * slot + 1)
        return Sizes(count, deep)

    def estimate(self, node: Node, scope: Mapping[str, Sizes]) -> Estimate:
        cost, sizes = self._estimate(node, scope)
        if self.checked.type_of(node).scalar:
            sizes = _SCALAR
        elif paths := self.values.get(node.id):
            sizes = self.path_sizes(paths)
        return Estimate(cost, sizes)

    def _estimate(self, node: Node, scope: Mapping[str, Sizes]) -> tuple[Poly, Sizes]:
        kind = node.kind
        if kind is NodeKind.CONST:
            value = node.value
            size = len(value) if isinstance(value, str | bytes) else 1
            return Poly.of(NODE), Sizes.flat(Poly.of(size))
        if kind is NodeKind.IDENT:
            return Poly.of(NODE), self._ident(node, scope)
        if kind is NodeKind.SELECT:
            assert node.operand is not None
            below = self.estimate(node.operand, scope)
            return below.cost + Poly.of(NODE), _SCALAR if node.test_only else below.sizes
        if kind is NodeKind.COMPREHENSION:
            return self._loop(node, scope)
        if kind in (NodeKind.LIST, NodeKind.MAP):
            parts = [self.estimate(child, scope) for child in node.children()]
            count = Poly.of(len(node.args) + len(node.entries))
            cost = Poly.of(NODE) + count.scaled(ELEMENT)
            deep = count
            for part in parts:
                cost, deep = cost + part.cost, deep + part.sizes.deep
            return cost, Sizes(count, deep)
        return self._call(node, scope)

    def _ident(self, node: Node, scope: Mapping[str, Sizes]) -> Sizes:
        if node.name in scope:
            return scope[node.name]
        name = self.checked.references.get(node.id, node.name)
        if name in OBJECT_ROOTS:
            return self.path_sizes(frozenset({(name, ())}))
        if name in self.variables:
            return self.variables[name]
        if name in _NAMES or name.startswith("variables."):  # the built-ins are names
            return Sizes.flat(Poly.of(NAME_BYTES))
        return Sizes.flat(Poly.of(REQUEST_BYTES))

    def _call(self, node: Node, scope: Mapping[str, Sizes]) -> tuple[Poly, Sizes]:
        operands = ([node.operand] if node.operand is not None else []) + list(node.args)
        parts = [self.estimate(operand, scope) for operand in operands]
        handler = _FUNCTIONS.get(node.name)
        if handler is None:
            raise CostError(f"the cost of {node.name}() is not known to the gatekeeper")
        kind = self.checked.type_of(node).kind
        extra, sizes = handler([part.sizes for part in parts], kind, self.smaller)
        cost = Poly.of(NODE) + extra
        for part in parts:
            cost = cost + part.cost
        return cost, sizes

    def _loop(self, node: Node, scope: Mapping[str, Sizes]) -> tuple[Poly, Sizes]:
        loop = node.loop
        assert loop is not None
        over = self.estimate(loop.iter_range, scope)
        ranges = self.values.get(loop.iter_range.id, frozenset())
        elements = (
            self.path_sizes(frozenset((r, (*s, EACH)) for r, s in ranges))
            if ranges
            else Sizes.flat(over.sizes.deep)
        )
        inner = dict(scope)
        if loop.iter_var2:
            inner[loop.iter_var], inner[loop.iter_var2] = Sizes.flat(over.sizes.deep), elements
        else:
            inner[loop.iter_var] = elements
        start = self.estimate(loop.accu_init, scope)
        element = self._element(ranges)
        if element is not None:
            self.elements.append(element)
        try:
            return self._body(loop, over, start, inner, scope, ranges)
        finally:
            if element is not None:
                self.elements.pop()

    def _element(self, ranges: frozenset[Path]) -> str | None:
        if len(ranges) != 1:
            return None
        ((root, steps),) = ranges
        return self.reads.describe(self.reads.slot((root, (*steps, EACH))))

    def _body(
        self,
        loop: Any,
        over: Estimate,
        start: Estimate,
        inner: dict[str, Sizes],
        scope: Mapping[str, Sizes],
        ranges: frozenset[Path],
    ) -> tuple[Poly, Sizes]:
        inner[loop.accu_var] = Sizes.flat(Poly.slot(_ACCUMULATOR))
        step = self.estimate(loop.loop_step, inner)
        grown = _accumulated(start.sizes, step.sizes, over.sizes.count)
        inner[loop.accu_var] = grown
        step = self.estimate(loop.loop_step, inner)
        condition = self.estimate(loop.loop_condition, inner)
        per_iteration = Poly.of(ITERATION) + condition.cost + step.cost
        iterations = self._iterations(per_iteration, over.sizes.count, ranges)
        result = self.estimate(loop.result, {**scope, loop.accu_var: grown})
        return over.cost + start.cost + iterations + result.cost, result.sizes

    def _iterations(self, per: Poly, count: Poly, ranges: frozenset[Path]) -> Poly:
        """``count`` times ``per``, where a term that grows with a part of the element (a loop
        over the element's own list) is summed over all the elements instead: those parts are
        disjoint pieces of one object, so their total is bounded by it, not by count times max."""
        element = self._element(ranges)
        if element is None:
            return per * count
        total = _ZERO
        for term, coefficient in per.terms.items():
            inside = [s for s in term if 0 <= s < SUM and self._under(s, element)]
            if inside:
                rest = list(term)
                rest.remove(inside[0])
                total = total + Poly({tuple(sorted((*rest, SUM + inside[0]))): coefficient})
            else:
                total = total + Poly({term: coefficient}) * count
        return total

    def _under(self, slot: int, element: str) -> bool:
        return _under(self.reads.describe(slot // 2), element)


def _under(path: str, element: str) -> bool:
    return path == element or path.startswith((element + ".", element + "["))


def _accumulated(start: Sizes, step: Sizes, iterations: Poly) -> Sizes:
    """The accumulator's size after every iteration: ``start`` plus, per iteration, what a step
    adds to it; refused when a step more than adds (``@result + @result`` doubles)."""
    out = []
    for begin, after in ((start.count, step.count), (start.deep, step.deep)):
        fresh, per, twice = after.split(_ACCUMULATOR)
        if twice or any(term for term in per.terms) or sum(per.terms.values()) > 1:
            raise CostError("a loop's accumulator grows faster than once per iteration")
        out.append(begin + fresh * iterations if per.terms else begin + fresh)
    return Sizes(out[0], out[1])


# --- the functions --------------------------------------------------------------------------------

_Smaller = Callable[[Poly, Poly], Poly]
_Handler = Callable[[Sequence[Sizes], str, _Smaller], tuple[Poly, Sizes]]


def _free(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    return _ZERO, _SCALAR


def _passes(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    """One of its operands' values (``orValue``, ``or``, a conditional's branches)."""
    count = deep = _ZERO
    for arg in args:
        count, deep = count.most(arg.count), deep.most(arg.deep)
    return _ZERO, Sizes(count, deep)


def _first(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    return _ZERO, args[0]


def _branches(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    return _passes(args[1:], kind, smaller)


def _equal(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    return smaller(args[0].deep, args[1].deep).scaled(EQUAL), _SCALAR


def _order(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    return smaller(args[0].count, args[1].count).scaled(CHAR), _SCALAR


def _add(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    count, deep = args[0].count + args[1].count, args[0].deep + args[1].deep
    if kind in ("int", "uint", "double", "timestamp", "duration"):
        return _ZERO, _SCALAR
    factor = CHAR if kind in ("string", "bytes") else ELEMENT
    return count.scaled(factor), Sizes(count, deep)


def _within(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    """Each element compared with the value: at most all the elements, or the value as many
    times as there are elements."""
    value, collection = args
    return smaller(collection.deep, collection.count * value.deep).scaled(EQUAL), _SCALAR


def _search(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    return (args[0].count * args[1].count).scaled(CHAR), _SCALAR


def _prefix(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    return args[1].count.scaled(CHAR), _SCALAR


def _matches(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    text, pattern = args[0].count, args[1].count
    return (text * pattern).scaled(REGEX) + pattern.scaled(ELEMENT), _SCALAR


def _walks(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    """A string function that walks its target once and gives a string no longer."""
    return args[0].count.scaled(CHAR), Sizes.flat(args[0].count)


def _quote(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    size = args[0].count.scaled(6) + Poly.of(2)  # every character may become \uXXXX
    return size.scaled(CHAR), Sizes.flat(size)


def _replace(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    text, old, new = args[0].count, args[1].count, args[2].count
    size = text * (new + _ONE) + new  # an empty pattern matches between every character
    return (text * (old + _ONE) + size).scaled(CHAR), Sizes.flat(size)


def _split(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    text, separator = args[0].count, args[1].count
    pieces = text + _ONE
    cost = (text * separator).scaled(CHAR) + pieces.scaled(ELEMENT)
    return cost, Sizes(pieces, pieces + text)


def _join(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    separator = args[1].count if len(args) > 1 else _ZERO
    size = args[0].deep + args[0].count * separator
    return size.scaled(CHAR), Sizes.flat(size)


def _format(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    size = args[0].count + args[1].deep.scaled(FORMAT)
    return size.scaled(CHAR), Sizes.flat(size)


def _to_string(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    size = args[0].deep.scaled(FORMAT)
    return size.scaled(CHAR), Sizes.flat(size)


def _parse(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    """A conversion that reads its argument once (``int('12')``, ``bytes('x')``…)."""
    cost = args[0].count.scaled(CHAR)
    return cost, Sizes.flat(args[0].count) if kind in ("bytes", "string") else _SCALAR


def _base64(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    size = args[0].count.scaled(2) + Poly.of(4)
    return size.scaled(CHAR), Sizes.flat(size)


def _extreme(args: Sequence[Sizes], kind: str, smaller: _Smaller) -> tuple[Poly, Sizes]:
    count = _ZERO
    for arg in args:
        count = count + arg.count
    return count.scaled(ELEMENT), _SCALAR


_FREE = (
    "!_", "-_", "_-_", "_*_", "_/_", "_%_", "_&&_", "_||_", "@not_strictly_false", "size",
    "type", "charAt", "hasValue", "optional.none", "optional.ofNonZeroValue",
    "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getFullYear", "getHours",
    "getMilliseconds", "getMinutes", "getMonth", "getSeconds",
    "math.abs", "math.bitAnd", "math.bitNot", "math.bitOr", "math.bitShiftLeft",
    "math.bitShiftRight", "math.bitXor", "math.ceil", "math.floor", "math.isFinite",
    "math.isInf", "math.isNaN", "math.round", "math.sign", "math.sqrt", "math.trunc",
)  # fmt: skip
_FUNCTIONS: dict[str, _Handler] = {
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


def describe(poly: Poly, reads: Reads) -> str:
    """The polynomial with its slots named by the paths they measure."""

    def name(slot: int) -> str:
        total = slot >= SUM
        slot -= SUM if total else 0
        path = reads.describe(slot // 2)
        shown = f"|{path}|" if slot % 2 == 0 else f"bytes({path})"
        return f"Σ{shown}" if total else shown

    parts = []
    for term, coefficient in sorted(poly.terms.items(), key=lambda item: -len(item[0])):
        factors = "·".join(name(slot) for slot in term)
        parts.append(f"{coefficient:g}" + (f"·{factors}" if factors else ""))
    return " + ".join(parts) or "0"


def worst(slot: int) -> float:
    """Every size at its largest: an object of :data:`MAX_OBJECT_BYTES`."""
    return float(MAX_OBJECT_BYTES)
