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
from gatekeeper.policy.cel._cut import Bound, Chain, Projection, ReadPlan, read_plan
from gatekeeper.policy.cel._env import BUILT_INS, OBJECT_ROOTS
from gatekeeper.policy.cel._poly import (
    CONVERT,
    CONVERT_VALUE,
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
from gatekeeper.policy.cel._reads import Flattenable, Path, Reads, chains
from gatekeeper.policy.cel._rewrite import rewrite

__all__ = [
    "Analysis",
    "Direct",
    "ProgramError",
    "analyze",
    "request_bound",
]

_Needed = Callable[[Program], tuple[Variable, ...]]


class ProgramError(CelError):
    """A fault of one expression found when its rule set is analysed (its cost)."""

    def __init__(self, program: Program, message: str) -> None:
        super().__init__(message, 0)
        self.program = program


@dataclass(frozen=True, slots=True)
class Direct:
    """The validations together, each value they read of the objects bound on its own: the
    chain ``object.spec.pool.name`` read as one name bound to that string, a list read only
    through one field of its elements (``devices`` in ``devices.all(d, d.name…)``) bound to
    that field's values, with ``d`` for ``d.name``. A write of the usual case converts those
    values alone, no mapping around them, and evaluates no select. Used first; when a path is
    not there, a list does not fit, or the validations do not all hold, the objects are cut as
    usual."""

    together: Program
    values: tuple[tuple[str, str, Chain], ...]
    """Each name bound, the root its value is at, and how that value is cut."""
    request: tuple[tuple[str, tuple[str, ...]], ...]
    """The fields of ``request`` it reads: each declaration, and its steps in the request."""
    builtins: tuple[tuple[str, str], ...]
    """The built-in variables it reads: each declaration, and the variable."""


@dataclass(frozen=True, slots=True)
class Analysis:
    """What a rule set reads and may cost."""

    plan: ReadPlan
    costs: Mapping[int, Poly]
    """Per program (by ``id``): one evaluation, its runtime call included."""
    write: Bound
    """Every expression a write may evaluate (the scope twice: object and stored object)."""
    read: Bound
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
    direct: Direct | None = None
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
    direct = None
    if together is not None:
        flattenable = reads.flattenable([p.checked for p in programs], measured)
        plan_flat = read_plan(reads, whole, measured, flattenable.fields)
        direct = _direct(variables, validations, needed, plan_flat, flattenable)
    reads_request = any(name.startswith("request.") for name in names)
    reads_stored = any(
        program.reads_stored or any(v.program.reads_stored for v in needed(program))
        for program in others
    )
    slots = len(plan.slots)
    return Analysis(
        plan, costs, Bound(every + read, slots), Bound(read, slots), names, worst_costs,
        together, needs, paths, direct, reads_request, reads_stored,
    )  # fmt: skip


def _direct(
    variables: tuple[Variable, ...],
    validations: tuple[Validation, ...],
    needed: _Needed,
    plan: ReadPlan,
    flattenable: Flattenable,
) -> Direct | None:
    """The validations together on the values they read bound on their own; None when a
    value cannot be cut on its own (a value above it is kept whole) or its name could be
    hidden by a comprehension's variable."""
    wanted = {v.name for validation in validations for v in needed(validation.program)}
    programs = [v.program for v in variables if v.name in wanted]
    programs += [validation.program for validation in validations]
    names: dict[Path, str] = {}
    selects: dict[int, dict[int, str]] = {}
    for program in programs:
        if any(name.startswith(_VALUE) for name in _locals(program)):
            return None
        edits = dict(flattenable.collapse.get(id(program.checked), {}))
        for node_id, path in chains(program.checked).items():
            edits[node_id] = names.setdefault(path, f"{_VALUE}{len(names)}")
        selects[id(program.checked)] = edits
    values = []
    for (root, steps), name in names.items():
        chain = plan.chain(root, steps)
        if chain is None:
            return None
        values.append((name, root, chain))
    together = _together(variables, validations, needed, selects, tuple(names.values()))
    if together is None:
        return None
    request = tuple(
        (name, tuple(name.split(".")[1:])) for name in together.names if name.startswith("request.")
    )
    builtins = tuple((name, name[10:]) for name in together.names if name.startswith("variables."))
    return Direct(together, tuple(values), request, builtins)


_VALUE = "__value_"
"""The names of the values :class:`Direct` binds: ``__value_0``, …"""


def _locals(program: Program) -> Iterable[str]:
    """The comprehensions' variables of ``program`` (``cel.bind``'s too)."""
    for node in program.checked.root.walk():
        if node.loop is not None:
            yield from (node.loop.iter_var, node.loop.iter_var2, node.loop.accu_var)


def _together(
    variables: tuple[Variable, ...],
    validations: tuple[Validation, ...],
    needed: _Needed,
    selects: Mapping[int, Mapping[int, str]],
    values: tuple[str, ...] = (),
) -> Program | None:
    """The validations as one expression, their variables bound with ``cel.bind`` in the order
    they are defined (a later one may read an earlier one), and the selects of ``selects``
    (per Checked) written as the name given (declared among ``values`` when not a loop's
    variable); None when a variable cannot be renamed where it is read, or there is nothing to
    put together."""
    if not validations:
        return None
    wanted = {v.name for validation in validations for v in needed(validation.program)}
    local = {f"variables.{v.name}": f"__v_{v.name}" for v in variables if v.name in wanted}

    def rename(name: str) -> tuple[str, frozenset[str]] | None:
        return (local[name], frozenset()) if name in local else None

    parts = []
    for validation in validations:
        part = rewrite(validation.program, rename, selects.get(id(validation.program.checked)))
        if part is None:
            return None
        parts.append(f"(\n{part}\n)")
    source = " && ".join(parts)
    for variable in reversed([v for v in variables if v.name in wanted]):
        value = rewrite(variable.program, rename, selects.get(id(variable.program.checked)))
        if value is None:
            return None
        source = f"cel.bind({local[f'variables.{variable.name}']}, (\n{value}\n), {source})"
    try:
        return compile_program(
            source, "validations", variables=BUILT_INS, result="bool", limit=None, values=values
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
    # Every object it reads converted and walked whole, at its largest (a value in every
    # other byte: `[0,0,…]`).
    return total + len(roots) * MAX_OBJECT_BYTES * (CONVERT + CONVERT_VALUE / 2 + WALK / 2)


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


def request_bound(analysis: Analysis, objects: Mapping[str, Any]) -> float:
    """The bound :func:`validate` compares with the budget, for ``objects``."""
    projection = Projection(len(analysis.plan.slots), float("inf"))
    for root, value in objects.items():
        analysis.plan.project(root, value, projection)
    return analysis.write.of(projection)
