"""One CEL expression of the policy: compiled and type-checked when the policy loads (what it
reads comes from its checked tree), evaluated on bindings the caller makes."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.messages import capped
from gatekeeper.policy.cel._ast import CelType, Checked
from gatekeeper.policy.cel._env import CheckError, check, globals_of, runtime_env

__all__ = [
    "MAX_EXPRESSIONS",
    "MAX_SOURCE",
    "CelError",
    "EvaluationError",
    "Outcome",
    "Program",
    "StatusReason",
    "Validation",
    "Variable",
    "activation",
    "compile_program",
    "evaluate",
    "programs_of",
]

MAX_SOURCE = 5 * 1024
"""Characters of one expression."""
MAX_EXPRESSIONS = 64
"""Expressions (variables, validations, scope) of one kind version, kind-level ones included."""


class CelError(ValueError):
    """An expression that does not compile, or that the policy cannot use; ``offset`` is where
    in its source the fault is (None: the expression as a whole)."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset


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
_RESULTS = {"bool": "bool", "string": "string"}


@dataclass(frozen=True, slots=True)
class Program:
    """One compiled expression; ``where`` names it in messages (file, key)."""

    source: str
    where: str
    compiled: Any = field(compare=False, repr=False)
    checked: Checked = field(compare=False, repr=False)
    names: frozenset[str] = frozenset()
    """Every declaration it reads: ``object``, ``oldObject``, ``request.<field>``,
    ``variables.<name>`` (comprehension variables aside)."""
    result: CelType = field(default_factory=lambda: CelType("dyn"))
    """The type it checks to (a policy variable is declared with it)."""

    @property
    def variables(self) -> frozenset[str]:
        """The ``variables.<name>`` it reads."""
        return frozenset(
            name.removeprefix("variables.") for name in self.names if name.startswith("variables.")
        )

    @property
    def reads_stored(self) -> bool:
        """Whether it reads ``oldObject``: CEL reaches a declaration only by its name, so one
        whose checked tree never names it cannot read the stored object."""
        return "oldObject" in self.names

    def reads(self, name: str) -> bool:
        return name in self.variables


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
class Outcome:
    """Why a set of validations refused: the validation, the code and the message; or the
    expression that could not be evaluated (``error`` set: refused, fail closed)."""

    name: str
    code: int
    message: str
    error: str = ""


def compile_program(
    source: Any,
    where: str,
    *,
    variables: Mapping[str, str],
    result: str = "bool",
    limit: int | None = MAX_SOURCE,
    values: tuple[str, ...] = (),
) -> Program:
    """Compile ``source`` against the objects, ``request``, ``variables`` (name → type
    signature: the built-ins and those defined before it) and ``values`` (values of the objects
    bound on their own, ``dyn``); CelError naming the problem (syntax,
    type, an unknown variable or field, a result that is not ``result``: ``bool``, ``string``
    or ``any``) and where in the source it is."""
    if not isinstance(source, str) or not source.strip():
        raise CelError("must be a non-empty CEL expression")
    if limit is not None and len(source) > limit:
        raise CelError(f"is {len(source)} characters long (at most {limit})")
    try:
        compiled, checked = check(source, variables, values)
    except CheckError as exc:
        raise CelError(str(exc), exc.offset) from None
    returned = checked.type_of(checked.root)
    wanted = _RESULTS.get(result)
    nullable = wanted == "string" and returned.kind == "wrapper"  # a string or null
    if wanted is not None and returned.kind not in (wanted, "dyn") and not nullable:
        raise CelError(f"must evaluate to a {wanted}, not {returned}", 0)
    names = frozenset(name for _, name in globals_of(checked))
    return Program(source, where, compiled, checked, names, returned)


class EvaluationError(Exception):
    """An expression that did not evaluate to a value: it refuses (fail closed)."""

    def __init__(self, program: Program, why: str) -> None:
        super().__init__(capped(why))
        self.program = program


def evaluate(program: Program, bound: Any) -> Any:
    """The value of ``program`` on ``bound`` (:func:`activation`), as plain Python data;
    EvaluationError when it fails."""
    try:
        value = program.compiled.eval(bound)
    except RuntimeError as exc:  # the runtime's iteration budget is raised, not returned
        raise EvaluationError(program, _runtime_message(str(exc))) from None
    if value.type().name() == "ERROR":
        raise EvaluationError(program, _runtime_message(str(value.value())))
    return value.plain_value()


def _runtime_message(text: str) -> str:
    """The runtime's error without its status prefix, cut to :data:`MAX_MESSAGE`."""
    text = capped(text.strip())
    for prefix in ("INVALID_ARGUMENT: ", "INTERNAL: ", "UNKNOWN: ", "NOT_FOUND: "):
        text = text.removeprefix(prefix)
    return text.removesuffix(" [INTERNAL]").removesuffix(" [INVALID_ARGUMENT]")


def activation(data: Mapping[str, Any]) -> Any:
    """The runtime's bindings: declarations by name (``object``, ``request.operation``,
    ``variables.node``); a value is converted the first time an expression reads it."""
    return runtime_env().Activation(data)


def programs_of(
    variables: Iterable[Variable], validations: Iterable[Validation], scope: Program | None
) -> Iterable[Program]:
    """Every program of a rule set: the variables, the scope, each validation and its message."""
    yield from (variable.program for variable in variables)
    if scope is not None:
        yield scope
    for validation in validations:
        yield validation.program
        if validation.message_expression is not None:
            yield validation.message_expression
