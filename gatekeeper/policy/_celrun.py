"""The CEL of one kind version, analysed when the policy loads (what it reads of the objects, what
each expression may cost) and run per request: the objects cut to what is read, the cost bounded
from their sizes before anything is evaluated, then the variables (lazily), the scope and the
validations, as a ValidatingAdmissionPolicy runs them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gatekeeper.messages import capped
from gatekeeper.policy._celcost import (
    CHAR,
    CONVERT,
    COST_LIMIT,
    EVALUATION,
    MAX_OBJECT_BYTES,
    REQUEST_BUDGET,
    SUM,
    UNITS,
    WALK,
    CostError,
    Poly,
    Sizes,
    estimate,
    worst,
)
from gatekeeper.policy._celenv import BUILT_INS, OBJECT_ROOTS
from gatekeeper.policy._celprogram import (
    CelError,
    EvaluationError,
    Outcome,
    Program,
    Validation,
    Variable,
    activation,
    compile_program,
    evaluate,
)
from gatekeeper.policy._celreads import OverBudget, Path, Projection, ReadError, ReadPlan, Reads
from gatekeeper.policy._celrewrite import rewrite

__all__ = ["Analysis", "ProgramError", "analyze", "bindings", "holds_scope", "validate"]

_Needed = Callable[[Program], tuple[Variable, ...]]


class ProgramError(CelError):
    """A fault of one expression found when its rule set is analysed (its cost)."""

    def __init__(self, program: Program, message: str) -> None:
        super().__init__(message, 0)
        self.program = program


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

    @property
    def reads_request(self) -> bool:
        return any(name.startswith("request.") for name in self.names)


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
    plan = reads.plan(frozenset(), measured)
    if bytes_needed & plan.walked:
        plan = reads.plan(bytes_needed, measured)
    worst_costs = {
        id(p): _worst(p, costs, needed) for p in (*(v.program for v in variables), *others)
    }
    for program in others:
        if worst_costs[id(program)] > COST_LIMIT:
            raise ProgramError(
                program, _too_costly(worst_costs[id(program)], program, reads, costs)
            )
    every = Poly()
    for cost in costs.values():
        every = every + cost
    read = Poly()
    if scope is not None:
        read = costs[id(scope)]
        for variable in needed(scope):
            read = read + costs[id(variable.program)]
    names = frozenset(
        name for program in (*(v.program for v in variables), *others) for name in program.names
    )
    together = _together(variables, validations, needed)
    programs = (*(v.program for v in variables), *others)
    needs = {id(p): needed(p) for p in programs}
    paths = {id(p): frozenset().union(*reads.values[id(p.checked)].values()) for p in programs}
    return Analysis(plan, costs, every + read, read, names, worst_costs, together, needs, paths)


def _together(
    variables: tuple[Variable, ...], validations: tuple[Validation, ...], needed: _Needed
) -> Program | None:
    """The validations as one expression, their variables bound with ``cel.bind`` in the order
    they are defined (a later one may read an earlier one); None when a variable cannot be
    renamed where it is read, or there is nothing to put together."""
    if not validations:
        return None
    wanted = {v.name for validation in validations for v in needed(validation.program)}
    local = {f"variables.{v.name}": f"__v_{v.name}" for v in variables if v.name in wanted}

    def rename(name: str) -> tuple[str, frozenset[str]] | None:
        return (local[name], frozenset()) if name in local else None

    parts = []
    for validation in validations:
        part = rewrite(validation.program, rename)
        if part is None:
            return None
        parts.append(f"(\n{part}\n)")
    source = " && ".join(parts)
    for variable in reversed([v for v in variables if v.name in wanted]):
        value = rewrite(variable.program, rename)
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
    total = costs[id(program)].value(worst)
    roots = set(_roots(program))
    for variable in needed(program):
        total += costs[id(variable.program)].value(worst)
        roots.update(_roots(variable.program))
    # Every object it reads converted and walked whole, at its largest.
    return total + len(roots) * MAX_OBJECT_BYTES * (CONVERT + WALK / 2)


def _roots(program: Program) -> Iterable[str]:
    return (root for root in OBJECT_ROOTS if root in program.names)


def _too_costly(cost: float, program: Program, reads: Reads, costs: Mapping[int, Poly]) -> str:
    from gatekeeper.policy._celcost import describe

    shown = capped(describe(costs[id(program)], reads), 600)
    return (
        f"may cost up to {cost:.3g} {UNITS} on a {MAX_OBJECT_BYTES // (1024 * 1024)} MiB "
        f"object, over the limit of {COST_LIMIT:.3g} per expression: its cost is {shown} "
        "(|x| is the size of x: a loop over a loop over the object, or map() and filter() over "
        "one of its lists, grow with its square)"
    )


# --- per request ---------------------------------------------------------------------------------


class _Budget(Exception):
    def __init__(self, bound: float) -> None:
        super().__init__(bound)
        self.bound = bound


def _projected(
    analysis: Analysis, objects: Mapping[str, Any], as_object: Iterable[Any], cost: Poly
) -> tuple[dict[str, Any], list[Any]]:
    """The objects cut to what is read, and the cost bound of evaluating ``cost`` on them;
    _Budget when over :data:`REQUEST_BUDGET`, ReadError for an object the runtime cannot get."""
    projection = Projection(len(analysis.plan.slots), REQUEST_BUDGET, (WALK, CONVERT, CHAR))
    try:
        cut = {
            root: analysis.plan.project(root, value, projection) for root, value in objects.items()
        }
        extra = [analysis.plan.project("object", value, projection) for value in as_object]
    except OverBudget as exc:
        raise _Budget(exc.spent) from None
    sizes, sums = projection.sizes, projection.sums
    bound = projection.spent + cost.value(lambda s: sums[s - SUM] if s >= SUM else sizes[s])
    if bound > REQUEST_BUDGET:
        raise _Budget(bound)
    return cut, extra


def _over_budget(bound: float) -> Outcome:
    why = (
        f"the CEL of this request may cost up to {bound:.3g} {UNITS} with objects of this "
        f"size, over the budget of {REQUEST_BUDGET:.3g} per request, so it is not evaluated"
    )
    return Outcome("cost", 403, f"cost: {why}", error=why)


def validate(
    analysis: Analysis,
    rules: _Rules,
    obj: Any,
    old: Any,
    request: Mapping[str, Any],
    builtins: Mapping[str, Any],
    scoped: tuple[str, ...],
) -> Outcome | None:
    """Evaluate ``rules`` on one write (see :func:`gatekeeper.policy.cel.run_validations`)."""
    try:
        stored = [old] if "oldObject" in scoped else []
        cut, extra = _projected(analysis, {"object": obj, "oldObject": old}, stored, analysis.write)
    except _Budget as exc:
        return _over_budget(exc.bound)
    except ReadError as exc:
        return Outcome("object", 403, f"object could not be evaluated: {exc}", error=str(exc))
    obj, old = cut["object"], cut["oldObject"]
    if not scoped and analysis.together is not None:
        data = bindings(analysis.names, obj, old, request, builtins)
        if _true(analysis.together, activation(data)):
            return None
    return _one_by_one(analysis, rules, obj, old, extra, request, builtins, scoped)


def _one_by_one(
    analysis: Analysis,
    rules: _Rules,
    obj: Any,
    old: Any,
    extra: list[Any],
    request: Mapping[str, Any],
    builtins: Mapping[str, Any],
    scoped: tuple[str, ...],
) -> Outcome | None:
    """The scope, then each validation in order: the first that does not hold, or cannot be
    evaluated, refuses (with its message, its reason's code, or its error)."""
    names: dict[int, str] = {id(v.program): f"variables.{v.name}" for v in rules.variables}
    bindings: _Bindings | None = None
    current: Program | None = None
    try:
        if rules.scope is not None:
            names[id(rules.scope)] = "scope"
            for root in scoped:
                subject = obj if root == "object" else extra[0]
                bindings = _Bindings(analysis, rules, subject, None, request, builtins)
                current = rules.scope
                if not _holds(rules.scope, bindings.activation(rules.scope)):
                    return Outcome("scope", 403, _scope_message(root, rules.scope))
        bindings = _Bindings(analysis, rules, obj, old, request, builtins)
        together = analysis.together if scoped else None
        if together is not None and _true(together, bindings.activation(together)):
            return None
        for validation in rules.validations:
            names[id(validation.program)] = validation.name
            current = validation.program
            if not _holds(validation.program, bindings.activation(validation.program)):
                message = _message(validation, bindings)
                return Outcome(validation.name, validation.reason.code, message)
    except EvaluationError as exc:
        if bindings is not None and current is not None:
            exc = bindings.cause(current, exc)  # a variable it read failed: name that one
        name = names.get(id(exc.program), exc.program.where)
        return Outcome(name, 403, f"{name} could not be evaluated: {exc}", error=str(exc))
    return None


def holds_scope(
    analysis: Analysis,
    rules: _Rules,
    obj: Any,
    request: Mapping[str, Any],
    builtins: Mapping[str, Any],
) -> bool:
    """Whether the scope holds for ``obj`` (a read); False when it cannot be evaluated."""
    assert rules.scope is not None
    try:
        cut, _ = _projected(analysis, {"object": obj}, (), analysis.read)
        bound = _Bindings(analysis, rules, cut["object"], None, request, builtins)
        return _true(rules.scope, bound.activation(rules.scope))
    except (_Budget, ReadError):
        return False


class _Rules(Protocol):
    """What :class:`gatekeeper.policy.cel.CelRules` offers this module."""

    @property
    def variables(self) -> tuple[Variable, ...]: ...

    @property
    def validations(self) -> tuple[Validation, ...]: ...

    @property
    def scope(self) -> Program | None: ...


class _Bindings:
    """The bindings of one evaluation; a variable is evaluated the first time an expression may
    need it, once.

    As an admission policy's, a variable that fails refuses only an expression that reads it: a
    failed one is left unbound, so that reading it is an error (fail closed), while an
    expression whose short-circuit never reads it (``request.operation == 'DELETE' ||
    variables.x …``) is not refused for it. :meth:`cause` names the failed variable behind an
    expression's error.
    """

    def __init__(
        self,
        analysis: Analysis,
        rules: _Rules,
        obj: Any,
        old: Any,
        request: Mapping[str, Any],
        builtins: Mapping[str, Any],
    ) -> None:
        self._needs = analysis.needs
        self._failed: dict[str, EvaluationError] = {}
        self._data = bindings(analysis.names, obj, old, request, builtins)
        self._activation: Any = None

    def activation(self, program: Program) -> Any:
        for variable in self._needs.get(id(program), ()):
            key = f"variables.{variable.name}"
            if key not in self._data and variable.name not in self._failed:
                try:
                    value = evaluate(variable.program, self._bound())
                except EvaluationError as exc:
                    self._failed[variable.name] = exc
                else:
                    self._data[key] = value
                    self._activation = None
        return self._bound()

    def _bound(self) -> Any:
        # One activation for the expressions of this write: the runtime converts a value the
        # first time an expression reads it and keeps it. Its names are fixed when it is made:
        # a variable evaluated since needs a new one.
        if self._activation is None:
            self._activation = activation(self._data)
        return self._activation

    def cause(self, program: Program, error: EvaluationError) -> EvaluationError:
        """The failure of a variable ``program`` needs, if one failed (else ``error``)."""
        for variable in self._needs.get(id(program), ()):
            # The runtime's error of reading an unbound name names it.
            if variable.name in self._failed and f"variables.{variable.name}" in str(error):
                return self._failed[variable.name]
        return error


def bindings(
    names: Iterable[str],
    obj: Any,
    old: Any,
    request: Mapping[str, Any],
    variables: Mapping[str, Any],
) -> dict[str, Any]:
    """The bindings of the declarations ``names`` (``request.<field>`` taken from the request's
    mapping, ``variables.<name>`` from ``variables``)."""
    data: dict[str, Any] = {}
    for name in names:
        if name == "object":
            data[name] = obj
        elif name == "oldObject":
            data[name] = old
        elif name.startswith("request."):
            value: Any = request
            for step in name.split(".")[1:]:
                value = value.get(step) if isinstance(value, Mapping) else None
            data[name] = value
        elif name.startswith("variables.") and name[10:] in variables:
            data[name] = variables[name[10:]]
    return data


def _true(program: Program, bound: Any) -> bool:
    """Whether ``program`` gives true (an error, of the runtime or of a value, is not)."""
    try:
        return program.compiled.eval(bound).value() is True
    except RuntimeError:
        return False


def _holds(program: Program, bound: Any) -> bool:
    value = evaluate(program, bound)
    if not isinstance(value, bool):
        raise EvaluationError(program, f"evaluated to {type(value).__name__}, not bool")
    return value


def _scope_message(root: str, scope: Program) -> str:
    which = "the stored object" if root == "oldObject" else "the object"
    return f"{which} is not the caller's (scope: {capped(scope.source, 1024)})"


def _message(validation: Validation, bindings: _Bindings) -> str:
    """The validation's message: its messageExpression's string when that evaluates to one
    (one line, not empty; cut to the cap), else ``message``, else the expression itself (as the
    apiserver)."""
    if validation.message_expression is not None:
        try:
            program = validation.message_expression
            text = evaluate(program, bindings.activation(program))
        except EvaluationError:
            text = None
        if isinstance(text, str) and text.strip() and "\n" not in text:
            return capped(text)
    return validation.message or f"failed expression: {capped(validation.program.source, 1024)}"
