"""The CEL of one kind version analysed when the policy loads: what its expressions read of the
objects (:mod:`gatekeeper.policy.cel._reads`), what each may cost (on the largest objects: an
expression over :data:`~gatekeeper.policy.cel._poly.COST_LIMIT` is refused, with its
estimate), the bound one request's CEL is held to, and the validations put together in one
expression for the usual case (all hold)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.messages import capped
from gatekeeper.policy.cel._cost import describe, estimate
from gatekeeper.policy.cel._cut import Projection, ReadPlan, read_plan
from gatekeeper.policy.cel._env import BUILT_INS, OBJECT_ROOTS
from gatekeeper.policy.cel._poly import (
    CHAR,
    CONVERT,
    COST_LIMIT,
    EVALUATION,
    MAX_OBJECT_BYTES,
    REQUEST,
    SUM,
    UNITS,
    WALK,
    CostError,
    Poly,
    Sizes,
    worst,
)
from gatekeeper.policy.cel._program import CelError, Program, Validation, Variable, compile_program
from gatekeeper.policy.cel._reads import Path, Reads
from gatekeeper.policy.cel._rewrite import rewrite

__all__ = [
    "Analysis",
    "Flat",
    "ProgramError",
    "analyze",
    "projection_bound",
    "request_bound",
]

_Needed = Callable[[Program], tuple[Variable, ...]]


class ProgramError(CelError):
    """A fault of one expression found when its rule set is analysed (its cost)."""

    def __init__(self, program: Program, message: str) -> None:
        super().__init__(message, 0)
        self.program = program


@dataclass(frozen=True, slots=True)
class Flat:
    """The validations together on objects whose lists read through one field of their
    elements are cut to that field's values (``devices`` to the devices' names), with
    ``d.name`` written ``d``: a write of the usual case converts a list of strings, not a list
    of mappings. Used first; when an object does not fit, or the validations do not all hold,
    the objects are cut as usual."""

    plan: ReadPlan
    together: Program


@dataclass(frozen=True, slots=True)
class Analysis:
    """What a rule set reads and may cost."""

    plan: ReadPlan
    costs: Mapping[int, Poly]
    """Per program (by ``id``): one evaluation, its runtime call included."""
    write: Poly
    """Every expression a write may evaluate (the scope twice: object and stored object)."""
    read: Poly
    """A read's scope and the variables it needs."""
    names: frozenset[str]
    """Every declaration an expression reads: the bindings to make."""
    worst: Mapping[int, float]
    """Per program: its cost on the largest objects, the variables it needs included."""
    together: Program | None = None
    """Every validation in one expression, the variables they need bound in it
    (``cel.bind``): one evaluation when all hold, the usual case. When it does not give true,
    the validations are evaluated one by one, as an admission policy evaluates them."""
    needs: Mapping[int, tuple[Variable, ...]] = field(default_factory=dict)
    """Per program: the variables it needs (:meth:`~gatekeeper.policy.cel.CelRules.needed`)."""
    paths: Mapping[int, frozenset[Path]] = field(default_factory=dict)
    """Per program: the paths of ``object`` and ``oldObject`` it reads (through its variables
    too)."""
    flat: Flat | None = None
    reads_request: bool = False
    """Whether an expression reads ``request`` (it is then made for the write)."""
    reads_stored: bool = False
    """Whether an expression that is evaluated (the scope, a validation or its message, a
    variable one of them needs) reads ``oldObject``."""


def analyze(
    variables: tuple[Variable, ...],
    validations: tuple[Validation, ...],
    scope: Program | None,
    needed: _Needed,
) -> Analysis:
    """The analysis of a rule set; ProgramError naming the expression that cannot be bounded
    or that costs more than :data:`COST_LIMIT` on the largest objects."""
    reads = Reads()
    aliases: dict[str, frozenset[Path]] = {}
    for variable in variables:
        aliases[f"variables.{variable.name}"] = reads.add(variable.program.checked, aliases)
    others = _others(validations, scope)
    for program in others:
        reads.mark(reads.add(program.checked, aliases), "whole")
    sizes: dict[str, Sizes] = {}
    costs: dict[int, Poly] = {}
    for program, name in [*((v.program, v.name) for v in variables), *((p, "") for p in others)]:
        try:
            found = estimate(program.checked, reads, sizes)
        except CostError as exc:
            raise ProgramError(program, str(exc)) from None
        costs[id(program)] = found.cost + Poly.of(EVALUATION)
        if name:
            sizes[f"variables.{name}"] = found.sizes
    # The sizes the costs read; a walked value's bytes are not measured, so a cost that needs
    # them keeps the value whole.
    variables_read = {
        s - SUM if s >= SUM else s for c in costs.values() for t in c.terms for s in t
    }
    measured = frozenset(v // 2 for v in variables_read)
    bytes_needed = frozenset(v // 2 for v in variables_read if v % 2 == 1)
    whole: frozenset[int] = frozenset()
    plan = read_plan(reads, whole, measured)
    if bytes_needed & plan.walked:
        whole = bytes_needed
        plan = read_plan(reads, whole, measured)
    worst_costs = {
        id(p): _worst(p, costs, needed) for p in (*(v.program for v in variables), *others)
    }
    for program in others:
        if worst_costs[id(program)] > COST_LIMIT:
            raise ProgramError(
                program, _too_costly(worst_costs[id(program)], program, reads, costs)
            )
    every = Poly.of(REQUEST)
    for cost in costs.values():
        every = every + cost
    read = Poly.of(REQUEST)
    if scope is not None:
        read = read + costs[id(scope)]
        for variable in needed(scope):
            read = read + costs[id(variable.program)]
    names = frozenset(
        name for program in (*(v.program for v in variables), *others) for name in program.names
    )
    together = _together(variables, validations, needed, {})
    programs = (*(v.program for v in variables), *others)
    needs = {id(p): needed(p) for p in programs}
    paths = {id(p): frozenset().union(*reads.values[id(p.checked)].values()) for p in programs}
    flat = None
    flattenable = reads.flattenable([p.checked for p in programs], measured)
    if together is not None and flattenable.fields:
        flat_together = _together(variables, validations, needed, flattenable.collapse)
        if flat_together is not None:
            flat = Flat(read_plan(reads, whole, measured, flattenable.fields), flat_together)
    reads_request = any(name.startswith("request.") for name in names)
    reads_stored = any(
        program.reads_stored or any(v.program.reads_stored for v in needed(program))
        for program in others
    )
    return Analysis(
        plan, costs, every + read, read, names, worst_costs, together, needs, paths, flat,
        reads_request, reads_stored,
    )  # fmt: skip


def _together(
    variables: tuple[Variable, ...],
    validations: tuple[Validation, ...],
    needed: _Needed,
    collapse: Mapping[int, frozenset[int]],
) -> Program | None:
    """The validations as one expression, their variables bound with ``cel.bind`` in the order
    they are defined (a later one may read an earlier one), and the selects of ``collapse``
    (per Checked) written as their loop's variable; None when a variable cannot be renamed
    where it is read, or there is nothing to put together."""
    if not validations:
        return None
    wanted = {v.name for validation in validations for v in needed(validation.program)}
    local = {f"variables.{v.name}": f"__v_{v.name}" for v in variables if v.name in wanted}

    def rename(name: str) -> tuple[str, frozenset[str]] | None:
        return (local[name], frozenset()) if name in local else None

    parts = []
    for validation in validations:
        part = rewrite(validation.program, rename, collapse.get(id(validation.program.checked)))
        if part is None:
            return None
        parts.append(f"(\n{part}\n)")
    source = " && ".join(parts)
    for variable in reversed([v for v in variables if v.name in wanted]):
        value = rewrite(variable.program, rename, collapse.get(id(variable.program.checked)))
        if value is None:
            return None
        source = f"cel.bind({local[f'variables.{variable.name}']}, (\n{value}\n), {source})"
    try:
        return compile_program(
            source, "validations", variables=BUILT_INS, result="bool", limit=None
        )
    except CelError:
        return None


def _others(validations: tuple[Validation, ...], scope: Program | None) -> list[Program]:
    out = [scope] if scope is not None else []
    for validation in validations:
        out.append(validation.program)
        if validation.message_expression is not None:
            out.append(validation.message_expression)
    return out


def _worst(program: Program, costs: Mapping[int, Poly], needed: _Needed) -> float:
    total = REQUEST + costs[id(program)].value(worst)
    roots = set(_roots(program))
    for variable in needed(program):
        total += costs[id(variable.program)].value(worst)
        roots.update(_roots(variable.program))
    # Every object it reads converted and walked whole, at its largest.
    return total + len(roots) * MAX_OBJECT_BYTES * (CONVERT + WALK / 2)


def _roots(program: Program) -> Iterable[str]:
    return (root for root in OBJECT_ROOTS if root in program.names)


def _too_costly(cost: float, program: Program, reads: Reads, costs: Mapping[int, Poly]) -> str:
    shown = capped(describe(costs[id(program)], reads), 600)
    return (
        f"may cost up to {cost:.3g} {UNITS} on a {MAX_OBJECT_BYTES // (1024 * 1024)} MiB "
        f"object, over the limit of {COST_LIMIT:.3g} per expression: its cost is {shown} "
        "(|x| is the size of x: a loop over a loop over the object, or map() and filter() over "
        "one of its lists, grow with its square)"
    )


def projection_bound(projection: Projection, cost: Poly) -> float:
    """What cutting the objects cost, and ``cost`` at their sizes."""
    sizes, sums = projection.sizes, projection.sums
    return projection.spent + cost.value(lambda s: sums[s - SUM] if s >= SUM else sizes[s])


def request_bound(analysis: Analysis, objects: Mapping[str, Any]) -> float:
    """The bound :func:`validate` compares with the budget, for ``objects``."""
    projection = Projection(len(analysis.plan.slots), float("inf"), (WALK, CONVERT, CHAR))
    for root, value in objects.items():
        analysis.plan.project(root, value, projection)
    return projection_bound(projection, analysis.write)
