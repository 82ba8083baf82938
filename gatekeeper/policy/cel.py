"""CEL in the policy: expressions compiled and type-checked when the policy loads, evaluated purely
per request with the variables of a ValidatingAdmissionPolicy (docs/policy.md#cel-rules).

The runtime is ``cel-expr-python`` (Google's C++ CEL, the optional syntax ``.?``/``[?…]`` and
``orValue`` included), imported on the first compile: a policy without CEL never loads it. What
the policy knows about an expression (the variables it reads, whether it reads ``oldObject``,
the paths of the objects it reads, what it may cost) comes from the checked tree the runtime
evaluates (:mod:`gatekeeper.policy._celast`), never from its text. Cost is bounded by
construction (:mod:`gatekeeper.policy._celcost`): an expression too costly on the largest
object is refused at load, a request whose objects make its CEL too costly is refused before
anything is evaluated, and every message an expression gives is capped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.policy._celcost import COST_LIMIT, REQUEST_BUDGET
from gatekeeper.policy._celprogram import (
    BUILT_IN_VARIABLES,
    MAX_EXPRESSIONS,
    MAX_SOURCE,
    CelError,
    EvaluationError,
    Outcome,
    Program,
    StatusReason,
    Validation,
    Variable,
    activation,
    compile_program,
    evaluate,
    programs_of,
)
from gatekeeper.policy._celrun import (
    Analysis,
    ProgramError,
    analyze,
    bindings,
    holds_scope,
    validate,
)

__all__ = [
    "BUILT_IN_VARIABLES",
    "COST_LIMIT",
    "MAX_EXPRESSIONS",
    "MAX_SOURCE",
    "REQUEST_BUDGET",
    "CelError",
    "CelRules",
    "EvaluationError",
    "Outcome",
    "Program",
    "ProgramError",
    "StatusReason",
    "Validation",
    "Variable",
    "activation",
    "bindings",
    "compile_program",
    "evaluate",
    "in_scope",
    "run_validations",
]


@dataclass(frozen=True, slots=True)
class CelRules:
    """The CEL of one kind version: the kind's own and the version's, in that order. Analysed
    when made (ProgramError for an expression whose cost cannot be bounded, or is too high)."""

    variables: tuple[Variable, ...] = ()
    validations: tuple[Validation, ...] = ()
    scope: Program | None = None
    """Rule CEL: whether an object is the caller's (reads are filtered by it, writes keep it)."""
    analysis: Analysis | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self and self.analysis is None:
            found = analyze(self.variables, self.validations, self.scope, self.needed)
            object.__setattr__(self, "analysis", found)

    def __bool__(self) -> bool:
        return bool(self.variables or self.validations or self.scope)

    @property
    def reads_request(self) -> bool:
        """Whether an expression reads ``request`` (it is then made for the write)."""
        return self.analysis is not None and self.analysis.reads_request

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
        return programs_of(self.variables, self.validations, self.scope)


def run_validations(
    rules: CelRules,
    obj: Any,
    old: Any,
    request: Mapping[str, Any],
    builtins: Mapping[str, Any],
    *,
    scoped: tuple[str, ...] = (),
) -> Outcome | None:
    """Evaluate ``rules`` on one write: the objects cut to what is read and the cost bounded
    first (over the budget: refused, nothing evaluated), then (rule CEL) the scope on each of
    ``scoped`` (``object``, ``oldObject``: the object written, the one stored), then every
    validation, variables evaluated as they are needed. The first that does not hold refuses;
    None when all hold."""
    if rules.analysis is None:
        return None
    return validate(rules.analysis, rules, obj, old, request, builtins, scoped)


def in_scope(
    rules: CelRules, obj: Any, request: Mapping[str, Any], builtins: Mapping[str, Any]
) -> bool:
    """Whether the scope of rule CEL holds for ``obj`` (a read: ``object`` is the object read).
    An expression that fails, or whose cost is over the budget, counts as not in scope
    (hidden)."""
    assert rules.scope is not None and rules.analysis is not None
    return holds_scope(rules.analysis, rules, obj, request, builtins)
