"""Per request, ``object`` and ``oldObject`` cut to what a kind version's CEL reads of them
(:mod:`gatekeeper.policy.cel._reads`), before the runtime converts them.

The runtime converts a bound object whole, eagerly, the first time an expression reads it (about
20 ns a byte: 40 µs for a 2 KB slice), and quotes the object in the error when one of its values
cannot be converted. The cut copy is what the expressions would have read from the whole object,
so every result is the same; it is converted in a fraction of the time, and its sizes (each
path's length, each value's bytes) bound the cost of the evaluation before it starts.

Numbers are converted as Go's JSON reads them at the apiserver (``sigs.k8s.io/json``: an integer
that does not fit int64 is a float64); one beyond a float64 is refused, as the apiserver refuses
the body.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gatekeeper.policy.cel._poly import CHAR, CONVERT, CONVERT_VALUE, MAP_KEY, SUM, WALK, Poly
from gatekeeper.policy.cel._reads import Path, Read, Reads

__all__ = [
    "Bound",
    "Chain",
    "OverBudget",
    "Projection",
    "ReadError",
    "ReadPlan",
    "Unfit",
    "go_numbers",
    "read_plan",
]

_INT64 = 1 << 63


class ReadError(ValueError):
    """An object that cannot be given to the runtime as JSON gives it (a number beyond a
    float64, a value nested past what the gatekeeper parses)."""


_WHOLE, _PRESENT, _SHAPE, _FIELDS, _EACH, _FLAT = range(6)


@dataclass(frozen=True, slots=True)
class _Plan:
    """How one path of an object is cut: kept whole (measured in C by orjson), kept empty (only
    tested with ``has()``), kept with its keys or elements but not their values (only
    measured), cut to some of its fields, or cut element by element. Walking in Python costs
    more per value than converting in C++, so only what saves conversion is walked."""

    how: int
    fields: Mapping[str, _Plan]
    each: _Plan | None
    slots: tuple[int, ...]
    """The size slot this path's value fills."""
    below: tuple[int, ...]
    """The slots of every path under it: a value kept whole fills them with its own size."""
    exact: tuple[tuple[tuple[str, ...], int], ...] = ()
    """Of those, the ones reached by fields alone (``spec.devices``), with their steps: a value
    kept whole measures their length where they are (a few lookups), not by its own size."""


def _plan(
    node: Read,
    forced: frozenset[int],
    root: str,
    steps: tuple[str, ...],
    flat: Mapping[Path, str],
) -> _Plan:
    below = tuple(sorted(_descendants(node)))
    slots = (node.slot,)
    if node.whole or node.slot in forced:
        exact = tuple(_by_fields(node, ()))
        return _Plan(_WHOLE, {}, None, slots, below, exact)
    if (root, steps) in flat:
        field = flat[(root, steps)]
        return _Plan(_FLAT, {field: _WHOLE_LEAF}, None, slots, below)
    if node.each is not None:
        each = _plan(node.each, forced, root, (*steps, "*"), flat)
        if node.fields or each.how == _WHOLE:
            return _Plan(_WHOLE, {}, None, slots, below)
        return _Plan(_EACH, {}, each, slots, below)
    if node.fields:
        if node.shape:
            return _Plan(_WHOLE, {}, None, slots, below)
        fields = {
            name: _plan(child, forced, root, (*steps, name), flat)
            for name, child in sorted(node.fields.items())
        }
        return _Plan(_FIELDS, fields, None, slots, below)
    if node.shape:
        return _Plan(_SHAPE, {}, None, slots, below)
    return _Plan(_PRESENT if node.present else _WHOLE, {}, None, slots, below)


_WHOLE_LEAF = _Plan(_WHOLE, {}, None, (), ())


def _selector(
    plan: _Plan, track: tuple[int, ...], whole: _Cutter, measured: frozenset[int]
) -> _Cutter:
    """A mapping cut to some of its fields. A field kept whole whose size no cost reads (a
    name, a flag) is copied inline: a call per field would cost more than the cut saves."""
    leaves: list[tuple[str, _Cutter]] = []
    fields: list[tuple[str, _Cutter]] = []
    for key, sub in plan.fields.items():
        cutter = _cutter(sub, measured)
        plain = sub.how == _WHOLE and not any(slot in measured for slot in sub.slots)
        (leaves if plain else fields).append((key, cutter))

    def select(value: Any, projection: Projection) -> Any:
        if type(value) is not dict:
            return whole(value, projection)
        projection.walked += 1
        if track:
            projection.record(track, len(value), 0)
        out = {}
        for key, cut in leaves:
            if key in value:
                item = value[key]
                kind = type(item)
                if kind is str:
                    projection.chars += len(item)
                elif kind not in _PLAIN and not (kind is int and -_INT64 <= item < _INT64):
                    item = cut(item, projection)
                out[key] = item
        for key, cut in fields:
            if key in value:
                out[key] = cut(value[key], projection)
        return out

    return select


def _plain_fields(plan: _Plan, measured: frozenset[int]) -> tuple[str, ...] | None:
    """The fields an element plan keeps, when it only keeps fields whole and measures none of
    them (``d.name`` of each device): its elements are then cut in one comprehension."""
    if plan.how != _FIELDS or any(slot in measured for slot in plan.slots):
        return None
    for sub in plan.fields.values():
        if sub.how != _WHOLE or any(slot in measured for slot in sub.slots):
            return None
    return tuple(plan.fields)


def _elements(value: list[Any], keys: tuple[str, ...], projection: Projection) -> Any:
    """Mappings cut to ``keys`` in one comprehension, then measured (and their numbers
    checked) in one call to orjson; None, to walk them one by one, when one is not a mapping or
    holds what orjson refuses (an integer past 53 bits)."""
    try:
        if len(keys) == 1:  # the common case, without a comprehension per element
            (key,) = keys
            cut = [{key: item[key]} if key in item else {} for item in value]
        else:
            cut = [{key: item[key] for key in keys if key in item} for item in value]
        if not all(type(item) is dict for item in value):
            return None
        dumped = orjson.dumps(cut, option=orjson.OPT_STRICT_INTEGER)
    except TypeError:  # an element that is not a mapping; an integer past 53 bits
        return None
    projection.convert(dumped)
    projection.check()
    return cut


def _by_fields(node: Read, steps: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], int]]:
    for name, child in node.fields.items():
        yield (*steps, name), child.slot
        yield from _by_fields(child, (*steps, name))


def _descendants(node: Read) -> Iterator[int]:
    for child in (*node.fields.values(), *((node.each,) if node.each is not None else ())):
        yield child.slot
        yield from _descendants(child)


def read_plan(
    reads: Reads,
    whole: frozenset[int] = frozenset(),
    measured: frozenset[int] = frozenset(),
    flat: Mapping[Path, str] | None = None,
) -> ReadPlan:
    """The projection of each root, fixed (the reads are complete): the paths of ``whole``
    kept whole (their bytes are needed), the sizes of ``measured`` recorded; the lists of
    ``flat`` cut to their elements' one field (:class:`Unfit` when one cannot be)."""
    plans = {root: _plan(node, whole, root, (), flat or {}) for root, node in reads.roots.items()}
    return ReadPlan(plans, reads.paths, measured)


class ReadPlan:
    """The projection of each root, compiled to one function per path, and the path each size
    slot measures. Slot ``s`` has two sizes: ``2s`` the value's length (characters, elements,
    entries), ``2s + 1`` its JSON bytes; only the slots a cost reads (``measured``) are
    recorded."""

    __slots__ = ("_cutters", "_measured", "_plans", "slots")

    def __init__(
        self, roots: Mapping[str, _Plan], slots: tuple[str, ...], measured: frozenset[int]
    ) -> None:
        self.slots = slots
        self._plans = dict(roots)
        self._measured = measured
        self._cutters = {root: _cutter(plan, measured) for root, plan in roots.items()}

    def chain(self, root: str, steps: tuple[str, ...]) -> Chain | None:
        """How the value at ``steps`` of ``root`` is cut on its own, as it is cut inside the
        whole cut object; None when a step is not one of the fields the plan cuts a mapping to
        (a value above it is kept whole)."""
        plan = self._plans.get(root)
        walked: list[tuple[str, tuple[int, ...]]] = []
        for step in steps:
            if plan is None or plan.how != _FIELDS or step not in plan.fields:
                return None
            walked.append((step, tuple(slot for slot in plan.slots if slot in self._measured)))
            plan = plan.fields[step]
        return None if plan is None else Chain(tuple(walked), _cutter(plan, self._measured))

    @property
    def walked(self) -> frozenset[int]:
        """The slots of values walked rather than kept whole: their bytes are not measured."""
        found: set[int] = set()
        pending = list(self._plans.values())
        while pending:
            plan = pending.pop()
            if plan.how != _WHOLE:
                found.update(plan.slots)
            pending.extend(plan.fields.values())
            if plan.each is not None:
                pending.append(plan.each)
        return frozenset(found)

    def project(self, root: str, value: Any, projection: Projection) -> Any:
        """``value`` cut to what the expressions read of ``root`` (unchanged when none reads
        it), its sizes recorded in ``projection``."""
        cutter = self._cutters.get(root)
        if cutter is None or value is None:
            return value
        return cutter(value, projection)


class Projection:
    """One request's cut objects: each measured size's largest value and total, and what the
    cut cost (mappings and elements walked, bytes and characters to convert);
    :class:`OverBudget` once that passes ``limit`` units."""

    __slots__ = ("chars", "converted", "keys", "limit", "sizes", "values", "walked")

    def __init__(self, slots: int, limit: float) -> None:
        self.sizes = [0] * (4 * slots)
        """Each size's largest value (``2 * slot`` and ``2 * slot + 1``), then each size's
        values added up (its instances under a list are disjoint)."""
        self.walked = self.converted = self.values = self.keys = self.chars = 0
        self.limit = limit

    @property
    def spent(self) -> float:
        """Units of the cut: per mapping or list walked, per byte and per value of a mapping or
        list kept whole (converted), per key of a mapping a loop ranges over, per character of a
        string."""
        return (
            self.walked * WALK
            + self.converted * CONVERT
            + self.values * CONVERT_VALUE
            + self.keys * MAP_KEY
            + self.chars * CHAR
        )

    def convert(self, dumped: bytes) -> None:
        """Charge the conversion of a value whose JSON is ``dumped``: the runtime builds each
        value of a mapping or list on its own, so its work follows their number more than the
        bytes. They are counted from the JSON text in C, as one per separator, key and container
        (one inside a string counts too: more, never fewer)."""
        self.converted += len(dumped)
        self.values += (
            dumped.count(b",") + dumped.count(b":") + dumped.count(b"{") + dumped.count(b"[")
        )

    def record(self, slots: tuple[int, ...], count: int, size: int) -> None:
        sizes = self.sizes
        sums = len(sizes) // 2
        for slot in slots:
            at = 2 * slot
            sizes[sums + at] += count
            sizes[sums + at + 1] += size
            if count > sizes[at]:
                sizes[at] = count
            if size > sizes[at + 1]:
                sizes[at + 1] = size

    def check(self) -> None:
        if self.spent > self.limit:
            raise OverBudget(self.spent)


class Bound:
    """A cost (:class:`~gatekeeper.policy.cel._poly.Poly`) made ready to evaluate on a
    projection's sizes, the cut's own cost added."""

    __slots__ = ("constant", "terms")

    def __init__(self, cost: Poly, slots: int) -> None:
        self.constant = sum(c for term, c in cost.terms.items() if not term)
        self.terms = tuple(
            (c, tuple(2 * slots + s - SUM if s >= SUM else s for s in term))
            for term, c in cost.terms.items()
            if term
        )

    def of(self, projection: Projection) -> float:
        total = self.constant + projection.spent
        sizes = projection.sizes
        for product, indices in self.terms:
            for index in indices:
                product *= sizes[index]
            total += product
        return total


_Cutter = Callable[[Any, Projection], Any]
_PLAIN = (bool, float, type(None))


@dataclass(frozen=True, slots=True)
class Chain:
    """The value at one path cut on its own (:meth:`ReadPlan.chain`): the mappings on the way
    are walked and measured as the whole cut walks them, the value cut as it cuts it."""

    steps: tuple[tuple[str, tuple[int, ...]], ...]
    """Each step, and the slots of the mapping it is taken from that a cost reads."""
    cutter: _Cutter

    def cut(self, value: Any, projection: Projection) -> Any:
        """The cut value at the path of ``value`` (a root); :class:`Unfit` when a step is not
        there, or not in a mapping (reading it is an error, or a value the cut keeps whole)."""
        if value is None and not self.steps:
            return None
        try:  # a step only a mapping has: any other value fails it (a string, a list)
            for step, track in self.steps:
                if track:
                    projection.record(track, len(value), 0)
                value = value[step]
        except (KeyError, TypeError):
            raise Unfit from None
        projection.walked += len(self.steps)
        return self.cutter(value, projection)


def _cutter(plan: _Plan, measured: frozenset[int]) -> _Cutter:
    """The function that cuts one path's value as ``plan`` says (a value of another shape than
    the plan expects is kept whole: the runtime then gives its own error, as on the whole
    object)."""
    track = tuple(slot for slot in plan.slots if slot in measured)
    exact = tuple((steps, (slot,)) for steps, slot in plan.exact if slot in measured)
    placed = {slot for _, (slot,) in exact}
    below = tuple(slot for slot in plan.below if slot in measured and slot not in placed)

    def whole(value: Any, projection: Projection) -> Any:
        kind = type(value)
        if kind is str:
            projection.chars += len(value)
            if track:
                projection.record(track, len(value), len(value) + 2)
            return value
        if kind is dict or kind is list:
            value, dumped = _measured(value)
            projection.convert(dumped)
            size = len(dumped)
            if track:
                projection.record(track, len(value), size)
            if below:
                projection.record(below, size, size)
            for steps, slots in exact:
                projection.record(slots, _length(value, steps), size)
            projection.check()
            return value
        if track:
            projection.record(track, 1, 8)
        return _scalar(value)

    if plan.how == _FIELDS:
        return _selector(plan, track, whole, measured)
    if plan.how == _FLAT:
        ((key, _),) = plan.fields.items()
        field = operator.itemgetter(key)

        def flatten(value: Any, projection: Projection) -> Any:
            # (Its cost is compared with the budget once every value is cut.)
            if type(value) is not list:
                raise Unfit
            try:  # an element not a mapping (a string, a list) or without the field: no
                cut = list(map(field, value))
                dumped = orjson.dumps(cut, option=orjson.OPT_STRICT_INTEGER)
            except (KeyError, TypeError):  # TypeError too: an integer past 53 bits
                raise Unfit from None  # (each element was a mapping: any other fails)
            projection.walked += 1 + len(value) // 8  # one comprehension, in C mostly
            projection.convert(dumped)
            if track:
                projection.record(track, len(value), 0)
            return cut

        return flatten
    if plan.how == _EACH:
        assert plan.each is not None
        element = _cutter(plan.each, measured)
        keys = _plain_fields(plan.each, measured)

        def each(value: Any, projection: Projection) -> Any:
            kind = type(value)
            if kind is not list and kind is not dict:
                return whole(value, projection)
            projection.walked += 1 + len(value)
            if kind is dict:  # a loop over a mapping: each key listed and bound in the runtime
                projection.keys += len(value)
            if track:
                projection.record(track, len(value), 0)
            projection.check()
            if kind is list:
                if keys is not None and (cut := _elements(value, keys, projection)) is not None:
                    return cut
                return [element(item, projection) for item in value]
            return {key: element(item, projection) for key, item in value.items()}

        return each
    if plan.how in (_SHAPE, _PRESENT):
        shape = plan.how == _SHAPE

        def keep(value: Any, projection: Projection) -> Any:
            kind = type(value)
            if kind is not list and kind is not dict:
                return whole(value, projection)
            if track:
                projection.record(track, len(value) if shape else 0, 0)
            if not shape:
                return kind()
            projection.values += len(value)  # each element converted (a null)
            return [None] * len(value) if kind is list else dict.fromkeys(value)

        return keep
    return whole


class Unfit(Exception):
    """An object the fast path's cut does not fit (a list that cannot be cut to its elements'
    one field, a path read that is not there): the objects are cut as usual."""


class OverBudget(Exception):
    """The objects alone cost more than the request's budget to convert."""

    def __init__(self, spent: float) -> None:
        super().__init__(spent)
        self.spent = spent


def _length(value: Any, steps: tuple[str, ...]) -> int:
    """The length of the value at ``steps`` (0 where there is none: reading it is an error)."""
    for step in steps:
        if type(value) is not dict or step not in value:
            return 0
        value = value[step]
    return len(value) if type(value) in (dict, list, str) else 1


def _measured(value: dict[str, Any] | list[Any]) -> tuple[Any, bytes]:
    """A mapping or list as the runtime gets it, and its JSON. orjson writes it in C and
    refuses an integer past 53 bits: only then is it walked for Go's conversions."""
    try:
        return value, orjson.dumps(value, option=orjson.OPT_STRICT_INTEGER)
    except TypeError:
        converted = go_numbers(value)
        return converted, orjson.dumps(converted)


def _scalar(value: Any) -> Any:
    if type(value) is int and not -_INT64 <= value < _INT64:
        return _float(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    raise ReadError(f"a value the gatekeeper did not parse ({type(value).__name__})")


def _float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        raise ReadError(
            "a number beyond a float64 (the apiserver refuses such a body too)"
        ) from None


def go_numbers(value: Any) -> Any:
    """``value`` with every integer that does not fit int64 as a float64, as Go's JSON reads it
    into an unstructured object; ReadError for what JSON cannot hold."""
    stack: list[tuple[Any, Any, Any]] = []
    root: list[Any] = [value]
    stack.append((root, 0, value))
    while stack:
        parent, key, item = stack.pop()
        kind = type(item)
        if kind is dict:
            copy = dict(item)
            parent[key] = copy
            stack.extend((copy, k, v) for k, v in item.items())
        elif kind is list:
            items = list(item)
            parent[key] = items
            stack.extend((items, index, v) for index, v in enumerate(item))
        elif kind is not str:
            parent[key] = _scalar(item)
    return root[0]
