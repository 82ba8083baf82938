"""The units of CEL's cost and the polynomials it is counted in: a bound in the sizes of what an
expression reads (:mod:`gatekeeper.policy.cel._cost` estimates it). The units are calibrated on
this runtime, about a nanosecond of its work each on the reference machine
(``bench/cel_bench.py`` prints the bound against the time evaluations take)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "CHAR",
    "CONVERT",
    "CONVERT_VALUE",
    "COST_LIMIT",
    "ELEMENT",
    "EQUAL",
    "EVALUATION",
    "FORMAT",
    "ITERATION",
    "MAP_KEY",
    "MAX_OBJECT_BYTES",
    "NAME_BYTES",
    "NODE",
    "ONE",
    "REGEX",
    "REGEX_COMPILE",
    "REQUEST",
    "REQUEST_BUDGET",
    "REQUEST_BYTES",
    "SCALAR",
    "SUM",
    "UNITS",
    "WALK",
    "ZERO",
    "CostError",
    "Poly",
    "Sizes",
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
REGEX_COMPILE = 1000
"""One character of a pattern, compiled at each evaluation (a pattern of 9 characters: about
10 µs)."""
FORMAT = 32
"""Characters one value may take when formatted as a string."""
CONVERT = 10
"""One byte of a mapping or list converted into the runtime (its characters: about 1 ns)."""
CONVERT_VALUE = 300
"""One value of a mapping or list converted into the runtime: a key or an element (about 150 ns,
up to 500 for a mapping's entry)."""
WALK = 400
"""One mapping or list of an object walked in Python to cut it to what is read."""
MAP_KEY = 2000
"""One key of a mapping a loop ranges over, besides the loop's iteration: the runtime lists and
binds a mapping's keys through the binding (measured: about 2 µs a key, where an element of a
list takes a tenth of that)."""
EVALUATION = 5000
"""One call into the runtime: its bindings and its result (about 2 µs)."""
REQUEST = 40_000
"""What running a kind's CEL costs besides its expressions: the objects' cut, the bindings,
the result (20 to 40 µs, measured with the fastest of hundreds of runs)."""
NAME_BYTES = 253
"""The longest name a built-in variable or ``request`` holds (a DNS subdomain: a node, a
driver, an object, a ServiceAccount, a pod)."""
REQUEST_BYTES = 2048
"""The largest other value of ``request`` (a group-version-kind, the caller's user info as the
apiserver's TokenReview or the gatekeeper gives it, the options)."""
UNITS = "units (about a nanosecond each)"


class CostError(ValueError):
    """An expression whose cost cannot be bounded (a function the model does not know, an
    accumulator that grows faster than linearly)."""


_Term = tuple[int, ...]
"""The size slots a term multiplies (sorted; a slot may repeat). Slot ``-1`` is an
accumulator's size while a loop is estimated; ``SUM + slot`` the sum of a slot's sizes."""
SUM = 1 << 20


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

    def __repr__(self) -> str:
        return " + ".join(f"{c:g}*{'*'.join(map(str, t)) or '1'}" for t, c in self.terms.items())


ONE = Poly.of(1)
ZERO = Poly()


@dataclass(frozen=True, slots=True)
class Sizes:
    """A value's bounds: ``count`` its length (characters, elements, entries; 1 for a
    number), ``deep`` everything in it (JSON bytes for a value read from an object)."""

    count: Poly
    deep: Poly

    @staticmethod
    def flat(size: Poly) -> Sizes:
        return Sizes(size, size)


SCALAR = Sizes(ONE, ONE)


def worst(slot: int) -> float:
    """Every size at its largest: an object of :data:`MAX_OBJECT_BYTES`."""
    return float(MAX_OBJECT_BYTES)
