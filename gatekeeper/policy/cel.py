"""CEL in the policy: expressions compiled when the policy loads, evaluated purely per request with
the variables of a ValidatingAdmissionPolicy (docs/policy.md#cel-rules).

The runtime is ``cel-expr-python`` (Google's C++ CEL, the optional syntax ``.?``/``[?…]`` and
``orValue`` included). It is imported on the first compile, so a policy without CEL never loads
it. Every expression sees ``object``, ``oldObject``, ``request`` and ``variables``, all dynamic
(objects stay JSON, no schema is compiled in).

Cost is bounded per evaluation by the runtime's comprehension budget (:data:`MAX_ITERATIONS`
iterations over all the loops of one expression, an error past it), and per request by the
policy's shape: at most :data:`MAX_EXPRESSIONS` expressions per version, each at most
:data:`MAX_SOURCE` characters, over inputs the gatekeeper already bounds (a 3 MiB body).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

__all__ = [
    "BUILT_IN_VARIABLES",
    "MAX_EXPRESSIONS",
    "MAX_ITERATIONS",
    "MAX_SOURCE",
    "CelError",
    "CelRules",
    "EvaluationError",
    "Outcome",
    "Program",
    "StatusReason",
    "Validation",
    "Variable",
    "activation",
    "compile_program",
    "evaluate",
    "in_scope",
    "run_validations",
]

MAX_ITERATIONS = 10_000
"""Comprehension iterations of one evaluation, all loops together: the runtime's own budget
(``comprehension_max_iterations``); past it the evaluation is an error, so the request is
refused. Checked by tests/policy/test_cel.py."""
MAX_SOURCE = 5 * 1024
"""Characters of one expression."""
MAX_EXPRESSIONS = 64
"""Expressions (variables, validations, scope) of one kind version, kind-level ones included."""

BUILT_IN_VARIABLES: Mapping[str, str] = {
    "node": "this node's name",
    "driver": "the calling driver's name",
    "namespace": "the namespace of the caller's ServiceAccount (null without a token)",
    "serviceAccount": "the name of the caller's ServiceAccount (null without a token)",
    "pod": "the name of the caller's pod, from its token (null when unknown)",
    "podUID": "the UID of the caller's pod, from its token (null when unknown)",
}
"""``variables.<name>`` every expression may read, set by the gatekeeper per request."""

_ROOTS = ("object", "oldObject", "request", "variables")
_STRING_LITERAL = re.compile(
    r"""(?:[rR]?(?:'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*"))""", re.S
)
_STORED_REFERENCE = re.compile(r"\boldObject\b")
_VARIABLE_REFERENCE = re.compile(r"\bvariables\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*\?)")


class CelError(ValueError):
    """An expression that does not compile, or that the policy cannot use."""


class StatusReason(enum.Enum):
    """A failed validation's ``reason``, as in a ValidatingAdmissionPolicy: it sets the code."""

    FORBIDDEN = "Forbidden"
    INVALID = "Invalid"
    UNAUTHORIZED = "Unauthorized"
    REQUEST_ENTITY_TOO_LARGE = "RequestEntityTooLarge"

    @property
    def code(self) -> int:
        return _CODES[self]


_CODES = {
    StatusReason.FORBIDDEN: 403,
    StatusReason.INVALID: 422,
    StatusReason.UNAUTHORIZED: 401,
    StatusReason.REQUEST_ENTITY_TOO_LARGE: 413,
}


@dataclass(frozen=True, slots=True)
class Program:
    """One compiled expression; ``where`` names it in messages (file, key)."""

    source: str
    where: str
    compiled: Any = field(compare=False, repr=False)
    variables: frozenset[str] = frozenset()
    """The ``variables.<name>`` it reads (a reference it cannot name counts as all)."""
    reads_stored: bool = True
    """Whether it names ``oldObject`` (outside string literals): CEL has no way to reach a
    binding but by its name, so one that does not name it never reads the stored object."""

    def reads(self, name: str) -> bool:
        return name in self.variables or "*" in self.variables


@dataclass(frozen=True, slots=True)
class Variable:
    """A named expression (``variables`` of a kind), read by later ones as ``variables.<name>``."""

    name: str
    program: Program


@dataclass(frozen=True, slots=True)
class Validation:
    """A condition every write of the kind must meet (a ValidatingAdmissionPolicy validation)."""

    name: str
    """Its ``name``, or ``validations[<i>]``: what a refusal and a policy test name."""
    program: Program
    message: str = ""
    message_expression: Program | None = None
    reason: StatusReason = StatusReason.FORBIDDEN


@dataclass(frozen=True, slots=True)
class CelRules:
    """The CEL of one kind version: the kind's own and the version's, in that order."""

    variables: tuple[Variable, ...] = ()
    validations: tuple[Validation, ...] = ()
    scope: Program | None = None
    """Rule CEL: whether an object is the caller's (reads are filtered by it, writes keep it)."""

    def __bool__(self) -> bool:
        return bool(self.variables or self.validations or self.scope)

    @property
    def reads_stored(self) -> bool:
        """Whether an expression that is evaluated may read ``oldObject``: the scope, a
        validation or its message, or a variable one of them reads (variables are lazy, so one
        nothing reads is never evaluated)."""
        roots = [self.scope] if self.scope is not None else []
        for validation in self.validations:
            roots.append(validation.program)
            if validation.message_expression is not None:
                roots.append(validation.message_expression)
        return any(
            program.reads_stored for root in roots for program in (root, *self._programs_of(root))
        )

    def _programs_of(self, program: Program) -> Iterable[Program]:
        return (variable.program for variable in self.needed(program))

    def needed(self, program: Program) -> tuple[Variable, ...]:
        """The variables ``program`` reads, directly or through other variables, in the order
        they are defined: evaluated lazily, as an admission policy's are, so a variable that
        only another validation reads cannot refuse this one."""
        wanted: set[str] = set()
        pending = [program]
        while pending:
            reads = pending.pop()
            for variable in self.variables:
                if variable.name not in wanted and reads.reads(variable.name):
                    wanted.add(variable.name)
                    pending.append(variable.program)
        return tuple(variable for variable in self.variables if variable.name in wanted)

    def programs(self) -> Iterable[Program]:
        yield from (variable.program for variable in self.variables)
        if self.scope is not None:
            yield self.scope
        for validation in self.validations:
            yield validation.program
            if validation.message_expression is not None:
                yield validation.message_expression


@dataclass(frozen=True, slots=True)
class Outcome:
    """Why a set of validations refused: the validation, the code and the message; or the
    expression that could not be evaluated (``error`` set: refused, fail closed)."""

    name: str
    code: int
    message: str
    error: str = ""


@cache
def _environment() -> Any:
    # Imported here, not at the top: a policy without CEL never loads the runtime (~20 MB).
    from cel_expr_python import cel
    from cel_expr_python.ext import ext_bindings, ext_encoders, ext_math, ext_optional, ext_strings

    return cel.NewEnv(
        variables={root: cel.Type.DYN for root in _ROOTS},
        extensions=[
            ext_optional.ExtOptional(),
            ext_strings.ExtStrings(),
            ext_bindings.ExtBindings(),
            ext_math.ExtMath(),
            ext_encoders.ExtEncoders(),
        ],
    )


def compile_program(
    source: Any, where: str, *, known: Iterable[str], result: str = "bool"
) -> Program:
    """Compile ``source``; CelError naming the problem (syntax, type, an unknown variable, a
    result that is not ``result``: ``bool``, ``string`` or ``any``)."""
    if not isinstance(source, str) or not source.strip():
        raise CelError("must be a non-empty CEL expression")
    if len(source) > MAX_SOURCE:
        raise CelError(f"is {len(source)} characters long (at most {MAX_SOURCE})")
    referenced = _variable_references(source)
    unknown = sorted(name for name in referenced - set(known) if name != "*")
    if unknown:
        raise CelError(
            f"reads variables.{unknown[0]}, which is not defined (defined: "
            f"{', '.join(sorted(known))}; a variable is read after it is defined)"
        )
    try:
        compiled = _environment().compile(source)
    except RuntimeError as exc:
        raise CelError(_compile_message(exc)) from None
    returned = compiled.return_type().name()
    wanted = {"bool": "BOOL", "string": "STRING", "any": returned}[result]
    if returned not in (wanted, "DYN"):
        raise CelError(f"must evaluate to a {result}, not {returned.lower()}")
    stored = _STORED_REFERENCE.search(_STRING_LITERAL.sub('""', source)) is not None
    return Program(source, where, compiled, frozenset(referenced), stored)


def _compile_message(exc: RuntimeError) -> str:
    """The runtime's compile error without its status prefix, on as few lines as it needs."""
    text = str(exc).strip()
    text = re.sub(r"^[A-Z_]+: ", "", text)
    text = re.sub(r"\s*\[[A-Z_]+\]$", "", text)
    # "ERROR: <input>:1:15: Syntax error: …" then the source and a caret: the position is
    # enough on one line.
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("|")]
    return " ".join(line.replace("ERROR: <input>:", "at ", 1) for line in lines)


def _variable_references(source: str) -> set[str]:
    """The ``variables.<name>`` a source reads (string literals aside); ``*`` for a reference
    that names no variable statically (``variables[?…]``)."""
    code = _STRING_LITERAL.sub('""', source)
    return {match.group(1) or "*" for match in _VARIABLE_REFERENCE.finditer(code)}


class EvaluationError(Exception):
    """An expression that did not evaluate to a value: it refuses (fail closed)."""

    def __init__(self, program: Program, why: str) -> None:
        super().__init__(why)
        self.program = program


def evaluate(program: Program, bound: Any) -> Any:
    """The value of ``program`` on ``bound`` (:func:`activation`), as plain Python data;
    EvaluationError when it fails."""
    try:
        value = program.compiled.eval(bound)
    except RuntimeError as exc:  # the iteration budget is raised, not returned
        raise EvaluationError(program, _compile_message(exc)) from None
    if value.type().name() == "ERROR":
        raise EvaluationError(program, str(value.value()))
    return value.plain_value()


def activation(data: Mapping[str, Any]) -> Any:
    """The runtime's bindings of ``object``, ``oldObject``, ``request``, ``variables`` (the
    values are converted when an expression reads them, not here)."""
    return _environment().Activation(data)


def run_validations(
    rules: CelRules,
    obj: Any,
    old: Any,
    request: Mapping[str, Any],
    builtins: Mapping[str, Any],
    *,
    scoped: tuple[str, ...] = (),
) -> Outcome | None:
    """Evaluate ``rules`` on one write: the variables in order, then (rule CEL) the scope on
    each of ``scoped`` (``object``, ``oldObject``: the object written, the one stored), then
    every validation. The first that does not hold refuses; None when all hold."""
    names = {id(variable.program): f"variables.{variable.name}" for variable in rules.variables}
    bindings: _Bindings | None = None
    current: Program | None = None
    try:
        if rules.scope is not None:
            names[id(rules.scope)] = "scope"
            for root in scoped:
                subject = obj if root == "object" else old
                bindings, current = _Bindings(rules, subject, None, request, builtins), rules.scope
                if not _holds(rules.scope, bindings.activation(rules.scope)):
                    return Outcome("scope", 403, _scope_message(root, rules.scope))
        bindings = _Bindings(rules, obj, old, request, builtins)
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


class _Bindings:
    """``object``, ``oldObject``, ``request`` and ``variables`` of one evaluation; a variable is
    evaluated the first time an expression may need it, once.

    As an admission policy's, a variable that fails refuses only an expression that reads it: a
    failed one is left out of ``variables``, so that reading it is an error (fail closed),
    while an expression whose short-circuit never reads it (``request.operation == 'DELETE' ||
    variables.x …``) is not refused for it. :meth:`cause` names the failed variable behind an
    expression's error.
    """

    def __init__(
        self,
        rules: CelRules,
        obj: Any,
        old: Any,
        request: Mapping[str, Any],
        builtins: Mapping[str, Any],
    ) -> None:
        self._rules = rules
        self._values: dict[str, Any] = dict(builtins)
        self._failed: dict[str, EvaluationError] = {}
        self._data = {
            "object": obj,
            "oldObject": old,
            "request": request,
            "variables": self._values,
        }
        self._activation: Any = None

    def activation(self, program: Program) -> Any:
        for variable in self._rules.needed(program):
            if variable.name not in self._values and variable.name not in self._failed:
                try:
                    value = evaluate(variable.program, self._bound())
                except EvaluationError as exc:
                    self._failed[variable.name] = exc
                else:
                    self._values[variable.name] = value
                    self._activation = None
        return self._bound()

    def _bound(self) -> Any:
        # One activation for every expression of this write: the runtime converts a value
        # the first time an expression reads it and keeps it, so the object is converted once,
        # not once per expression (~30 µs for a 2 KB slice). It keeps ``variables`` as it was
        # when first read: a variable evaluated since needs a new activation.
        if self._activation is None:
            self._activation = activation(self._data)
        return self._activation

    def cause(self, program: Program, error: EvaluationError) -> EvaluationError:
        """The failure of a variable ``program`` needs, if one failed (else ``error``)."""
        for variable in self._rules.needed(program):
            # The runtime's error of reading an absent key names the key.
            if variable.name in self._failed and f'"{variable.name}"' in str(error):
                return self._failed[variable.name]
        return error


def in_scope(
    rules: CelRules, obj: Any, request: Mapping[str, Any], builtins: Mapping[str, Any]
) -> bool:
    """Whether the scope of rule CEL holds for ``obj`` (a read: ``object`` is the object read).
    An expression that fails counts as not in scope (hidden)."""
    assert rules.scope is not None
    try:
        bindings = _Bindings(rules, obj, None, request, builtins)
        return _holds(rules.scope, bindings.activation(rules.scope))
    except EvaluationError:
        return False


def _holds(program: Program, bound: Any) -> bool:
    value = evaluate(program, bound)
    if not isinstance(value, bool):
        raise EvaluationError(program, f"evaluated to {type(value).__name__}, not bool")
    return value


def _scope_message(root: str, scope: Program) -> str:
    which = "the stored object" if root == "oldObject" else "the object"
    return f"{which} is not the caller's (scope: {scope.source})"


def _message(validation: Validation, bindings: _Bindings) -> str:
    """The validation's message: its messageExpression's string when that evaluates to one
    (one line, not empty), else ``message``, else the expression itself (as the apiserver)."""
    if validation.message_expression is not None:
        try:
            program = validation.message_expression
            text = evaluate(program, bindings.activation(program))
        except EvaluationError:
            text = None
        if isinstance(text, str) and text.strip() and "\n" not in text:
            return text
    return validation.message or f"failed expression: {validation.program.source}"
