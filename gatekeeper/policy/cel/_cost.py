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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.policy.cel._ast import Checked, Node, NodeKind
from gatekeeper.policy.cel._env import OBJECT_ROOTS
from gatekeeper.policy.cel._functions import FUNCTIONS
from gatekeeper.policy.cel._poly import (
    ELEMENT,
    ITERATION,
    NAME_BYTES,
    NODE,
    REQUEST_BYTES,
    SCALAR,
    SUM,
    ZERO,
    CostError,
    Poly,
    Sizes,
)
from gatekeeper.policy.cel._reads import EACH, Path, Reads

__all__ = ["Estimate", "describe", "estimate"]

_NAMES = frozenset(
    {"request.name", "request.namespace", "request.operation", "request.subResource",
     "request.requestSubResource", "request.userInfo.username", "request.userInfo.uid"}
)  # fmt: skip
_ACCUMULATOR = -1


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
        request (:class:`~gatekeeper.policy.cel._cut.Projection`)."""
        count = deep = ZERO
        for path in sorted(paths):
            slot = self.reads.slot(path)
            count, deep = count + Poly.slot(2 * slot), deep + Poly.slot(2 * slot + 1)
        return Sizes(count, deep)

    def estimate(self, node: Node, scope: Mapping[str, Sizes]) -> Estimate:
        cost, sizes = self._estimate(node, scope)
        if self.checked.type_of(node).scalar:
            sizes = SCALAR
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
            return below.cost + Poly.of(NODE), SCALAR if node.test_only else below.sizes
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
        handler = FUNCTIONS.get(node.name)
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
        # The range's elements (a mapping's keys) are listed once before the first iteration.
        listed = over.sizes.count.scaled(ELEMENT)
        return over.cost + start.cost + listed + iterations + result.cost, result.sizes

    def _iterations(self, per: Poly, count: Poly, ranges: frozenset[Path]) -> Poly:
        """``count`` times ``per``, where a term that grows with a part of the element (a loop
        over the element's own list) is summed over all the elements instead: those parts are
        disjoint pieces of one object, so their total is bounded by it, not by count times max."""
        element = self._element(ranges)
        if element is None:
            return per * count
        total = ZERO
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
