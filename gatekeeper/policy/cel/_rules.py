"""The CEL of one kind version (:class:`CelRules`, analysed when made), and the calls the engine
makes: a write's validations, a read's scope, a write's cost bound."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.policy.cel._analysis import Analysis, analyze, request_bound
from gatekeeper.policy.cel._program import Outcome, Program, Validation, Variable, programs_of
from gatekeeper.policy.cel._run import holds_scope, validate

__all__ = ["CelRules", "cost_bound", "in_scope", "run_validations"]


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
        return self.analysis is not None and self.analysis.reads_stored

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


def cost_bound(rules: CelRules, obj: Any, old: Any = None) -> float:
    """The cost bound of evaluating ``rules`` on a write of ``obj`` over ``old`` (in units of
    about a nanosecond), as computed before evaluating: the budget is compared with it."""
    if rules.analysis is None:
        return 0.0
    return request_bound(rules.analysis, {"object": obj, "oldObject": old})


def in_scope(
    rules: CelRules, obj: Any, request: Mapping[str, Any], builtins: Mapping[str, Any]
) -> bool:
    """Whether the scope of rule CEL holds for ``obj`` (a read: ``object`` is the object read).
    An expression that fails, or whose cost is over the budget, counts as not in scope
    (hidden)."""
    assert rules.scope is not None and rules.analysis is not None
    return holds_scope(rules.analysis, rules, obj, request, builtins)
