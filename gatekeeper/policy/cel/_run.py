"""The CEL of one kind version run on one request, as a ValidatingAdmissionPolicy runs it: the
objects cut to what is read and the cost bounded from their sizes before anything is evaluated
(over the budget: refused), then the validations together (the usual case: all hold), or the
scope and each validation in order, their variables evaluated lazily, once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from gatekeeper.messages import capped
from gatekeeper.policy.cel._analysis import Analysis, Direct
from gatekeeper.policy.cel._cut import Bound, OverBudget, Projection, ReadError, ReadPlan, Unfit
from gatekeeper.policy.cel._poly import REQUEST_BUDGET, UNITS
from gatekeeper.policy.cel._program import (
    EvaluationError,
    Outcome,
    Program,
    Validation,
    Variable,
    activation,
    evaluate,
)

__all__ = ["bindings", "holds_scope", "validate"]


class _Budget(Exception):
    def __init__(self, bound: float) -> None:
        super().__init__(bound)
        self.bound = bound


def _projected(
    analysis: Analysis,
    plan: ReadPlan,
    objects: Mapping[str, Any],
    as_object: Iterable[Any],
    cost: Bound | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """The objects cut as ``plan`` says, and the cost bound of evaluating ``cost`` on them (a
    write's CEL by default); _Budget when over :data:`REQUEST_BUDGET`, ReadError for an
    object the runtime cannot get."""
    projection = Projection(len(plan.slots), REQUEST_BUDGET)
    try:
        cut = {root: plan.project(root, value, projection) for root, value in objects.items()}
        extra = [plan.project("object", value, projection) for value in as_object]
    except OverBudget as exc:
        raise _Budget(exc.spent) from None
    bound = (analysis.write if cost is None else cost).of(projection)
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
    objects = {"object": obj, "oldObject": old}
    together = analysis.together if not scoped else None
    try:
        if together is not None and analysis.direct is not None:
            held = _direct_hold(analysis, analysis.direct, objects, request, builtins)
            if held:
                return None
            if held is not None:
                together = None  # they do not all hold: one by one
        stored = [old] if "oldObject" in scoped else []
        cut, extra = _projected(analysis, analysis.plan, objects, stored)
    except _Budget as exc:
        return _over_budget(exc.bound)
    except ReadError as exc:
        return Outcome("object", 403, f"object could not be evaluated: {exc}", error=str(exc))
    obj, old = cut["object"], cut["oldObject"]
    if together is not None:
        data = bindings(analysis.names, obj, old, request, builtins)
        if _true(together, activation(data)):
            return None
    return _one_by_one(analysis, rules, obj, old, extra, request, builtins, scoped)


def _direct_hold(
    analysis: Analysis,
    direct: Direct,
    objects: Mapping[str, Any],
    request: Mapping[str, Any],
    builtins: Mapping[str, Any],
) -> bool | None:
    """Whether the validations all hold, on the values they read bound on their own; None
    when an object does not fit (it is then cut as usual)."""
    projection = Projection(len(analysis.plan.slots), REQUEST_BUDGET)
    data = {name: builtins[key] for name, key in direct.builtins if key in builtins}
    for name, steps in direct.request:
        value: Any = request
        for step in steps:
            value = value.get(step) if isinstance(value, Mapping) else None
        data[name] = value
    try:
        for name, root, chain in direct.values:
            data[name] = chain.cut(objects[root], projection)
    except Unfit:
        return None
    except OverBudget as exc:
        raise _Budget(exc.spent) from None
    bound = analysis.write.of(projection)
    if bound > REQUEST_BUDGET:
        raise _Budget(bound)
    try:
        return direct.together.compiled.eval(data=data).value() is True
    except RuntimeError:
        return False


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
                bindings = _Bindings(analysis, subject, None, request, builtins)
                current = rules.scope
                if not _holds(rules.scope, bindings.activation(rules.scope)):
                    return Outcome("scope", 403, _scope_message(root, rules.scope))
        bindings = _Bindings(analysis, obj, old, request, builtins)
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
        cut, _ = _projected(analysis, analysis.plan, {"object": obj}, (), analysis.read)
        bound = _Bindings(analysis, cut["object"], None, request, builtins)
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
